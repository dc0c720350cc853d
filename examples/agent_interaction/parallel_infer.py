"""Run agent rollouts in parallel on Dask and verify them (a thin wrapper over `uni_agent.run`).

    python examples/agent_interaction/parallel_infer.py --n 2 --max-samples 2 --max-turns 3 --output-dir outputs/tour

Results go to --output-dir (default outputs/run): results/ (Parquet), summary.json, run.json, logs/. A bad flag value
is an error naming the flag before anything starts; `--help` lists them all.
"""

import sys

from uni_agent.cli import main

if __name__ == "__main__":  # LocalCluster spawns worker processes: the guard is required
    sys.exit(main(["run", *sys.argv[1:]]))
