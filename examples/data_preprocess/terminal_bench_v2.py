"""Terminal-Bench 2 task folders → DIR/terminal_bench_v2_<deployment>.parquet (rows in the seed schema).

    python examples/data_preprocess/terminal_bench_v2.py --tasks-dir terminal-bench-2/ --local-save-dir data/ \
        --deployment podman --build-images
    python examples/data_preprocess/terminal_bench_v2.py --local-save-dir data/ --deployment local   # bundled tasks

Task folders that cannot be read (or run on the deployment) are reported by name and left out. See
`uni_agent/terminal_bench/preprocess.py` for the row layout; `uni-agent preprocess-tb --help` for every flag.
"""

import sys

from uni_agent.cli import main

if __name__ == "__main__":
    sys.exit(main(["preprocess-tb", *sys.argv[1:]]))
