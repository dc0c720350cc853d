#!/bin/bash
echo "$ROT_TEXT" | "$ROT_TOOL" > /app/encoded.txt
