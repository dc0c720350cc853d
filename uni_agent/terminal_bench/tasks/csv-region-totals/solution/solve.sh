#!/bin/bash
cd /app
python3 - <<'PY'
import csv, json
totals = {}
for row in csv.DictReader(open("data/sales.csv")):
    totals[row["region"]] = totals.get(row["region"], 0.0) + float(row["amount"])
json.dump(totals, open("totals.json", "w"), indent=2)
PY
