"""Grade every task's gold patch (or an empty patch) in parallel on Dask: a check of tasks and grader.

    python examples/agent_interaction/parallel_verify.py --patch gold --output-dir outputs/verify-gold
"""

import sys

from uni_agent.cli import main

if __name__ == "__main__":
    sys.exit(main(["verify", *sys.argv[1:]]))
