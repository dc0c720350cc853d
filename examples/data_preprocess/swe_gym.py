"""SWE-Gym (SWE-Gym/SWE-Gym: the SWE-bench schema on 11 other repositories) → DIR/swe_gym_<deployment>.parquet,
rows in the seed schema.

    python examples/data_preprocess/swe_gym.py --local-save-dir data/ --input swe_gym.parquet \
        --specs swe_gym_specs.json --deployment podman

SWE-Gym's repositories are not in swebench 4.1.0's spec table: --specs gives each repo (and version, or "*") its
test_cmd and log_parser (and install / eval_commands, as SWE-Gym's harness fork has them); every row carries its spec.
Images: xingyaoww/sweb.eval.x86_64.<instance_id with __ as _s_>, lower-cased.
Without --input the rows are read from the Hugging Face hub. Needs the `swebench` extra: pip install -e '.[swebench]'.
A row that cannot be used is reported (`skipped malformed row N (instance_id=...): <field and why>`) and left out.
"""

import sys

from uni_agent.swebench.preprocess import main

if __name__ == "__main__":
    sys.exit(main(["--source", "swe_gym", *sys.argv[1:]]))
