#!/bin/bash
echo 'Hello, Terminal-Bench!' > /app/greeting.txt
