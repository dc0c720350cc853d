"""SWE-smith (SWE-bench/SWE-smith: bugs injected into source, per-repository images, no test patch)
→ DIR/swe_smith_<deployment>.parquet, rows in the seed schema.

    python examples/data_preprocess/swe_smith.py --local-save-dir data/ --input swe_smith.parquet --deployment podman

Rows are graded by `swe_smith`: the bug patch sets the task state (the gold answer is its reverse), then
SWE-smith's harness steps and rule (uni_agent/swebench/smith.py). --local-repos DIR: DIR/<owner>__<repo>.<commit8>
holds each clean repository for --deployment local.
Without --input the rows are read from the Hugging Face hub. Needs the `swebench` extra: pip install -e '.[swebench]'.
A row that cannot be used is reported (`skipped malformed row N (instance_id=...): <field and why>`) and left out.
"""

import sys

from uni_agent.swebench.preprocess import main

if __name__ == "__main__":
    sys.exit(main(["--source", "swe_smith", *sys.argv[1:]]))
