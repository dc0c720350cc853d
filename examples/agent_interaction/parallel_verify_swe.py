"""Gold-patch check of SWE-bench rows at scale: grade every row's gold patch (or an empty patch) in a fresh sandbox,
in parallel on Dask, with the official eval flow (reward `swe_bench`).

    python examples/data_preprocess/swe_bench_verified.py --local-save-dir data --input verified.parquet \
        --deployment modal
    python examples/agent_interaction/parallel_verify_swe.py --data-path data/swe_bench_verified_modal.parquet \
        --output-dir outputs/verify-swe-gold [--patch empty] [--eval-timeout 1800] [--scheduler-file ...]

Writes verify_<patch>.parquet and summary.json (resolved / wrong_answer / timeout_or_error ids) under --output-dir;
rerunning with the same --output-dir resumes (instances already graded are kept; timeouts and errors run again).
All `uni-agent verify` flags apply; --data-path defaults to $DATA_PATH. --eval-timeout (default 1800 s, the official
harness's) replaces the agent config's reward.eval_timeout and deployment.runtime_timeout for every row.
"""

import argparse
import json
import os
import sys

from uni_agent.cli import build_parser, main, settings_from
from uni_agent.config import ConfigError


def verify_swe(argv: list[str]) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--eval-timeout", type=float, default=1800)
    ours, rest = extra.parse_known_args(argv)
    if "--data-path" not in rest and os.environ.get("DATA_PATH"):
        rest = ["--data-path", os.environ["DATA_PATH"], *rest]
    args = build_parser().parse_args(["verify", *rest])
    if args.data_path is None:
        print("error: give --data-path (or DATA_PATH), e.g. data/swe_bench_verified_modal.parquet", file=sys.stderr)
        return 2

    from uni_agent import AgentConfigs
    from uni_agent.driver.inputs import resolve_path
    from uni_agent.driver.verify import verify_all

    settings = settings_from(args)
    agents = AgentConfigs.load(resolve_path(settings.agent_config_path)).override_all(
        {"reward": {"eval_timeout": ours.eval_timeout}, "env": {"deployment": {"runtime_timeout": ours.eval_timeout}}})
    outcome = verify_all(agent_config=agents, settings=settings, patch=args.patch)
    print(json.dumps(outcome.summary, indent=2))
    return 0


if __name__ == "__main__":  # LocalCluster spawns worker processes: the guard is required
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        print(__doc__)
        sys.exit(main(["verify", "--help"]))
    try:
        sys.exit(verify_swe(sys.argv[1:]))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
