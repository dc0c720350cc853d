"""SWE-bench Verified → DIR/swe_bench_verified_<deployment>.parquet (rows in the seed schema).

    DEPLOYMENT=modal python examples/data_preprocess/swe_bench_verified.py --local-save-dir data/
    python examples/data_preprocess/swe_bench_verified.py --local-save-dir data/ \
        --input SWE-bench_Verified/test.parquet --deployment podman --max-instances 20

Without --input the official dataset is read from the Hugging Face hub (princeton-nlp/SWE-bench_Verified). Needs the
`swebench` extra: pip install -e '.[swebench]'. See `uni_agent/swebench/preprocess.py` for the row layout.
"""

import sys

from uni_agent.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess-swe", *sys.argv[1:]]))
