#!/bin/bash
mkdir -p /logs/verifier
printf 'one two three\nfour  five\n\nsix\n' > /tmp/sample.txt
got=$(bash "$WORDCOUNT_HOME/bin/wordcount.sh" /tmp/sample.txt | tr -d '[:space:]')
echo "wordcount printed: $got (want 6)"
if [ "$got" = 6 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
