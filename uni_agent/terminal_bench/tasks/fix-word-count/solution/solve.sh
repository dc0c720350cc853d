#!/bin/bash
sed -i 's/wc -l/wc -w/' /app/bin/wordcount.sh
