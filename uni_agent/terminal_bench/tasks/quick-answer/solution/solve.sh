#!/bin/bash
echo 71 > /app/answer.txt
