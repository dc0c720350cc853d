#!/bin/bash
# Reward 1 when /app/greeting.txt holds exactly the greeting line, else 0 (reward.txt style).
mkdir -p /logs/verifier
if [ "$(cat /app/greeting.txt 2>/dev/null)" = "Hello, Terminal-Bench!" ] && [ "$(wc -l < /app/greeting.txt)" = 1 ]; then
  echo "greeting found"
  echo 1 > /logs/verifier/reward.txt
else
  echo "greeting missing or wrong: $(head -c 200 /app/greeting.txt 2>&1)"
  echo 0 > /logs/verifier/reward.txt
fi
