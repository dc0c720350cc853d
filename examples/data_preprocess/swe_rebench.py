"""SWE-rebench (nebius/SWE-rebench: per-instance install_config and images) → DIR/swe_rebench_<deployment>.parquet,
rows in the seed schema.

    python examples/data_preprocess/swe_rebench.py --local-save-dir data/ --input swe_rebench.parquet \
        --deployment podman

Each row's install_config (test_cmd, log_parser, install) becomes its test spec, as SWE-rebench's harness fork
reads it; the image is the row's docker_image (else swerebench/sweb.eval.x86_64.<id>).
Without --input the rows are read from the Hugging Face hub. Needs the `swebench` extra: pip install -e '.[swebench]'.
A row that cannot be used is reported (`skipped malformed row N (instance_id=...): <field and why>`) and left out.
"""

import sys

from uni_agent.swebench.preprocess import main

if __name__ == "__main__":
    sys.exit(main(["--source", "swe_rebench", *sys.argv[1:]]))
