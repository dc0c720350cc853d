"""Grades /app/totals.json against the CSV; writes /logs/verifier/reward.json (reward + one metric per check)."""
import csv
import json
import os

expected: dict[str, float] = {}
with open("/app/data/sales.csv") as handle:
    for row in csv.DictReader(handle):
        expected[row["region"]] = expected.get(row["region"], 0.0) + float(row["amount"])
try:
    with open("/app/totals.json") as handle:
        found = json.load(handle)
except (OSError, ValueError) as exc:
    print(f"cannot read /app/totals.json: {exc}")
    found = {}
found = found if isinstance(found, dict) else {}
right = [r for r, v in expected.items() if isinstance(found.get(r), int | float) and abs(found[r] - v) < 1e-6]
metrics = {
    "regions_right": len(right) / len(expected),
    "no_extra_keys": float(set(found) <= set(expected)),
    "region_count_matches": float(len(expected) == int(os.environ["EXPECTED_REGIONS"])),
}
metrics["reward"] = float(all(v == 1.0 for v in metrics.values()))
print(json.dumps(metrics))
with open("/logs/verifier/reward.json", "w") as handle:
    json.dump(metrics, handle)
