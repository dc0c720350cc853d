#!/bin/bash
mkdir -p /logs/verifier
if [ "$(tr -d '[:space:]' < /app/answer.txt 2>/dev/null)" = 71 ]; then r=1; else r=0; fi
echo "answer: $(head -c 50 /app/answer.txt 2>&1); reward $r"
echo $r > /logs/verifier/reward.txt
