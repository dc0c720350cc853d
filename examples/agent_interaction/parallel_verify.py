"""Grade every task's gold patch (or an empty patch) in parallel on Dask: a check of tasks and grader.

    python examples/agent_interaction/parallel_verify.py --patch gold     # -> outputs/verify-gold/
    python examples/agent_interaction/parallel_verify.py --patch empty    # -> outputs/verify-empty/

Each patch kind has its own default output dir (--output-dir overrides it): verify_<patch>.parquet, one row per task,
and summary.json (resolved / wrong_answer / timeout_or_error ids, each error's reason under `errors`). The summary is
printed on stdout; the last line on stderr says where both files went. `--help` lists the flags that apply.
"""

import sys

from uni_agent.cli import main

if __name__ == "__main__":  # LocalCluster spawns worker processes: the guard is required
    sys.exit(main(["verify", *sys.argv[1:]]))
