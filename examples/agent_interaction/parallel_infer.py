"""Run agent rollouts in parallel on Dask and verify them (a thin wrapper over `uni_agent.run`).

    python examples/agent_interaction/parallel_infer.py --n 2 --output-dir outputs/demo
"""

import sys

from uni_agent.cli import main

if __name__ == "__main__":  # LocalCluster spawns worker processes: the guard is required
    sys.exit(main(["run", *sys.argv[1:]]))
