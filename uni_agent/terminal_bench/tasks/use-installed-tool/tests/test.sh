#!/bin/bash
mkdir -p /logs/verifier
want=$(echo "terminal bench" | /opt/rot/rot13)
got=$(cat /app/encoded.txt 2>/dev/null)
echo "encoded.txt: $got (want $want)"
[ -n "$want" ] && [ "$got" = "$want" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
