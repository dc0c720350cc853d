"""Parquet bytes per rollout of a run's results, with and without the columns that issue 14 added (the token-exact
training sequence, failure kinds, attempts), for the same rows: a before/after pair from one run.

    .venv/bin/python examples/parquet_size.py outputs/quickstart

Both tables are written the way ResultStore writes them (zstd, one file) to a temporary directory and measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from uni_agent.driver.results import RESULT_SCHEMA, ResultStore  # noqa: E402

ADDED = ("mask_reason", "failure_kind", "failure_cause", "input_ids", "loss_mask", "logprobs", "token_source",
         "tokens_missing", "token_drift", "attempts")


def sizes(output_dir: Path) -> dict[str, float]:
    frame = ResultStore(output_dir).read()
    table = pa.Table.from_pandas(frame, schema=RESULT_SCHEMA, preserve_index=False)
    before = table.drop_columns(list(ADDED))
    tokens = frame["input_ids"].map(lambda ids: 0 if ids is None else len(ids))
    out: dict[str, float] = {"rollouts": len(frame), "mean_tokens_per_rollout": round(float(tokens.mean()), 1)}
    with tempfile.TemporaryDirectory() as tmp:
        for name, t in (("before", before), ("after", table)):
            path = Path(tmp) / f"{name}.parquet"
            pq.write_table(t, path, compression="zstd")
            out[f"{name}_bytes_per_rollout"] = round(path.stat().st_size / max(1, len(frame)), 1)
    out["after_over_before"] = round(out["after_bytes_per_rollout"] / out["before_bytes_per_rollout"], 3)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", help="a run's --output-dir (holds results/)")
    args = parser.parse_args()
    result = sizes(Path(args.output_dir))
    print(f"{result['rollouts']} rollouts, {result['mean_tokens_per_rollout']} tokens each on average")
    print(f"bytes per rollout  before (no token columns): {result['before_bytes_per_rollout']:>10,.0f}")
    print(f"bytes per rollout  after  (this schema):      {result['after_bytes_per_rollout']:>10,.0f}"
          f"   ({result['after_over_before']}x)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
