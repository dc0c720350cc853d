"""The `uni-agent` command: run rollouts, verify gold/empty patches, convert tasks to Parquet, preprocess
SWE-bench Verified, export a run's patches as predictions for the official SWE-bench harness."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .config import ConfigError
from .driver.interrupt import RunInterrupted
from .sandbox.private_dir import UnsafeDirectory
from .engines.engine_names import ENGINES
from .registry import is_import_path

# Flags of both `run` and `verify`: which rows, which cluster, where results go.
COMMON_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--data-path", {"help": "Parquet rows in the seed schema (default: the bundled tasks)"}),
    ("--agent-config-path", {"help": "agent config YAML"}),
    ("--scheduler-address", {"help": "tcp://host:8786 of a running dask scheduler"}),
    ("--scheduler-file", {"help": "scheduler file of a running dask scheduler"}),
    ("--local-workers", {"type": int, "aliases": ["--n-workers"],
                         "help": "worker processes of the LocalCluster started when no scheduler is given; 0 "
                                 "(default): one per 2 usable CPUs, 2 to 16"}),
    ("--max-samples", {"type": int, "help": "first K rows; -1 = all"}),
    ("--eval-timeout", {"type": float, "help": "seconds a grading may take, for every row (default: each row's "
                                               "reward.eval_timeout; SWE-bench's official limit is 1800)"}),
    ("--git-mirror", {"help": "--build-envs: a directory of git mirrors (default: clone from GitHub)"}),
]


def _engine(name: str) -> str:
    """A registered engine, or a start function's import path (imported when the run starts: engines.check_engine)."""
    if name in ENGINES or is_import_path(name):
        return name
    known = ", ".join(repr(n) for n in ENGINES.names())
    raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {known}, or module:function)")


# Flags of `run` only: the agent, its model and its rollouts (verification grades a fixed patch, no model).
RUN_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--model-path", {"help": "GGUF file (llama_cpp) or model path (vllm)"}),
    ("--model", {"dest": "model_name", "help": "served model name (external: which model to call)"}),
    ("--engine", {"type": _engine, "metavar": "{" + ",".join(ENGINES.names()) + "}|module:function"}),
    ("--base-url", {"help": "external engine: OpenAI-compatible endpoint, e.g. http://host:8000/v1"}),
    ("--api-key", {"help": "external engine: API key (prefer the UNI_AGENT_API_KEY environment variable)"}),
    ("--agent-workers", {"type": int, "aliases": ["--num-workers"],
                         "help": "AgentWorker actors; 0 (default): one per sandbox worker process "
                                 "(--num-workers: the seed's name)"}),
    ("--start-rate", {"type": float, "help": "rollouts started per second, evenly spaced (0, the default: all at "
                                              "once); spreads a wave whose turns would come back as one burst"}),
    ("--max-turns", {"type": int}),
    ("--n", {"type": int, "help": "rollouts per task"}),
    ("--temperature", {"type": float}),
    ("--top-p", {"type": float}),
    ("--max-tokens", {"type": int}),
    ("--context-length", {"type": int}),
    ("--engine-replicas", {"type": int}),
    ("--engine-device", {"choices": ["auto", "cpu", "gpu"], "help": "llama_cpp: on GPU workers or on CPUs"}),
    ("--engine-parallel", {"type": int, "help": "llama_cpp: request slots per replica"}),
    ("--nnodes", {"type": int}),
    ("--n-gpus-per-node", {"type": int}),
    ("--tp", {"type": int, "help": "tensor parallel size (vllm)"}),
    ("--token-capture", {"choices": ["auto", "off", "llama_server", "vllm"],
                         "help": "keep each call's token ids and logprobs (auto: by engine; external: off)"}),
]
SWITCHES = {"build_envs": "--build-envs", "verify": "--no-verify", "progress": "--no-progress",
            "retry_errors": "--retry-errors",
            "share_with_group": "--share-with-group", "dashboard": "--no-dashboard"}
TYPED = "typed_flags"  # the namespace's record of which spelling of an aliased flag was given


class _AliasedFlag(argparse.Action):
    """A flag with other spellings: stores the value and the spelling typed, so that an error names that one."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        typed = dict(getattr(namespace, TYPED, None) or {})
        typed[self.dest] = option_string
        setattr(namespace, TYPED, typed)


def add_run_flags(parser: argparse.ArgumentParser, verify: bool = False) -> None:
    """The settings flags of `run`, or of `verify` (only those that apply to grading a fixed patch)."""
    default_dir = "outputs/verify-<patch>" if verify else "outputs/run"
    parser.add_argument("--output-dir", default=None,
                        help=f"results, summary.json and logs go here; rerunning resumes (default: {default_dir})")
    for flag, kwargs in COMMON_FLAGS if verify else COMMON_FLAGS + RUN_FLAGS:
        kwargs = dict(kwargs)
        aliases = kwargs.pop("aliases", [])
        if aliases:
            kwargs["action"] = _AliasedFlag
        parser.add_argument(flag, *aliases, default=None, **kwargs)
    if not verify:
        parser.add_argument("--no-verify", dest="verify", action="store_const", const=False, default=None)
        parser.add_argument("--no-progress", dest="progress", action="store_const", const=False, default=None)
        parser.add_argument("--retry-errors", dest="retry_errors", action="store_const", const=True, default=None,
                            help="resuming: run again the rollouts whose failure_kind is infra (their rows replaced)")
    parser.add_argument("--build-envs", dest="build_envs", action="store_const", const=True, default=None,
                        help="SWE-bench rows get their environment first, as `uni-agent envs build` makes it (cached)")
    parser.add_argument("--share-with-group", dest="share_with_group", action="store_const", const=True, default=None,
                        help="outputs readable by your group (0750/0640); default: private to you (0700/0600)")
    parser.add_argument("--no-dashboard", dest="dashboard", action="store_const", const=False, default=None,
                        help="the run's LocalCluster serves no dashboard and no uni-agent page")


def flag_names() -> dict[str, str]:
    """Settings field -> the flag that sets it, so a bad value is reported by the flag the user typed."""
    names = {"output_dir": "--output-dir", **SWITCHES}
    for flag, kwargs in COMMON_FLAGS + RUN_FLAGS:
        names[kwargs.get("dest", flag[2:].replace("-", "_"))] = flag
    return names


def settings_from(args: argparse.Namespace, skip: tuple[str, ...] = ("command", "patch", "func", TYPED)):
    """CLI flags override environment and settings file; only flags actually given are passed."""
    from .settings import load_settings

    given = {k: v for k, v in vars(args).items() if v is not None and k not in skip}
    return load_settings(flags={**flag_names(), **(getattr(args, TYPED, None) or {})}, **given)


def cmd_run(args: argparse.Namespace) -> int:
    from .driver.run import run

    outcome = run(settings=settings_from(args))
    print(json.dumps(outcome.summary, indent=2))
    return _exit_status(outcome.summary)


def cmd_verify(args: argparse.Namespace) -> int:
    from .driver.verify import verify_all

    outcome = verify_all(settings=settings_from(args), patch=args.patch)
    print(json.dumps(outcome.summary, indent=2))
    return _exit_status(outcome.summary)


INFRA_OUTAGE_EXIT = 3  # distinct from 1 (an error before or during the run) and 2 (bad arguments)


def _exit_status(summary: dict) -> int:
    from .driver.summary import infra_outage

    reason = infra_outage(summary)
    if reason is None:
        return 0
    print(f"error: {reason}", file=sys.stderr)
    return INFRA_OUTAGE_EXIT


def cmd_convert(args: argparse.Namespace) -> int:
    from .tasks.swe_form import convert

    count = convert(Path(args.tasks_dir) if args.tasks_dir else None, Path(args.out), args.agent_name)
    print(f"wrote {count} rows to {args.out}")
    return 0


def cmd_preprocess_swe(args: argparse.Namespace) -> int:
    from .swebench.preprocess import run_cli

    return run_cli(args)


def cmd_preprocess_tb(args: argparse.Namespace) -> int:
    from .terminal_bench.preprocess import run_cli

    return run_cli(args)


def cmd_export_preds(args: argparse.Namespace) -> int:
    from .reports.swebench_predictions import export_predictions

    preds, report_path, report = export_predictions(args.output_dir, args.model_name, args.rollout)
    print(f"wrote {report['submitted_instances']} predictions to {preds}")
    print(f"wrote the official-shaped report to {report_path}: {report['resolved_instances']} resolved, "
          f"{report['unresolved_instances']} unresolved, {report['error_instances']} errors, "
          f"{report['empty_patch_instances']} empty patches of {report['total_instances']} instances")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from .reports.run_report import write_report

    path = write_report(args.output_dir, args.out, max_trajectories=args.max_trajectories)
    print(f"wrote {path}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="uni-agent", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    # No abbreviations: `verify --n 2` would be taken for --n-workers 2 without a word.
    run_parser = sub.add_parser("run", help="run agent rollouts and verify them", allow_abbrev=False)
    add_run_flags(run_parser)
    run_parser.set_defaults(func=cmd_run)
    verify_parser = sub.add_parser("verify", help="grade each task's gold (or an empty) patch", allow_abbrev=False)
    add_run_flags(verify_parser, verify=True)
    verify_parser.add_argument("--patch", choices=["gold", "oracle", "empty"], default="gold",
                               help="gold/oracle: each task's reference solution (Terminal-Bench: solution/solve.sh)")
    verify_parser.set_defaults(func=cmd_verify)
    convert_parser = sub.add_parser("convert-tasks", help="tasks in SWE-bench instance form → Parquet rows")
    convert_parser.add_argument("--tasks-dir", help="directory of task dirs (default: the bundled tasks)")
    convert_parser.add_argument("--out", required=True)
    convert_parser.add_argument("--agent-name", default="swe_agent")
    convert_parser.set_defaults(func=cmd_convert)
    from .swebench.preprocess import add_arguments

    swe_parser = sub.add_parser("preprocess-swe", help="SWE-bench Verified → Parquet rows for a deployment")
    add_arguments(swe_parser)
    swe_parser.set_defaults(func=cmd_preprocess_swe)
    from .terminal_bench.preprocess import add_arguments as add_tb_arguments

    tb_parser = sub.add_parser("preprocess-tb", help="Terminal-Bench 2 task folders → Parquet rows for a deployment")
    add_tb_arguments(tb_parser)
    tb_parser.set_defaults(func=cmd_preprocess_tb)
    preds_parser = sub.add_parser(
        "export-preds", help="a run's patches → preds.jsonl + the official harness's report shape")
    preds_parser.add_argument("output_dir", help="the run's --output-dir (holds results/ and summary.json)")
    preds_parser.add_argument("--model-name", help="model_name_or_path (default: from summary.json, else uni-agent)")
    preds_parser.add_argument("--rollout", type=int, default=0, help="which rollout of each instance (default 0)")
    preds_parser.set_defaults(func=cmd_export_preds)
    report_parser = sub.add_parser("report", help="a run's results → one self-contained HTML report")
    report_parser.add_argument("output_dir", help="the run's --output-dir (holds results/)")
    report_parser.add_argument("--out", help="the HTML file to write (default: OUTPUT_DIR/report.html)")
    report_parser.add_argument("--max-trajectories", type=int, default=150,
                               help="trajectories rendered in the file (failing and slowest first; default 150)")
    report_parser.set_defaults(func=cmd_report)
    from .bench.main import add_arguments as add_bench_arguments, cmd_bench

    bench_parser = sub.add_parser("bench", help="framework overhead and throughput against a latency-controlled "
                                                "endpoint, side by side with mini-swe-agent; prints one table")
    add_bench_arguments(bench_parser)
    bench_parser.set_defaults(func=cmd_bench)
    from .driver.tls import add_arguments as add_tls_arguments, cmd_tls

    tls_parser = sub.add_parser("tls", help="TLS credentials for a cluster started apart (dask scheduler/worker, "
                                            "cluster/): `uni-agent tls init [DIR]`")
    add_tls_arguments(tls_parser)
    tls_parser.set_defaults(func=cmd_tls)
    from .harness.prepare import add_arguments as add_prepare_arguments, cmd_prepare

    harness_parser = sub.add_parser("harness", help="agent programs run as the agent: `uni-agent harness prepare "
                                                    "mini-swe-agent` makes the environment to mount (docs/harness.md)")
    harness_sub = harness_parser.add_subparsers(dest="harness_command", required=True)
    prepare_parser = harness_sub.add_parser("prepare", help="make a harness program's venv for mounting into "
                                                            "sandboxes; prints its directory")
    add_prepare_arguments(prepare_parser)
    prepare_parser.set_defaults(func=cmd_prepare)
    from .cache_maintenance import add_arguments as add_cache_arguments, cmd_cache

    cache_parser = sub.add_parser("cache", help="the uni-agent cache: `uni-agent cache size`, `uni-agent cache prune`")
    add_cache_arguments(cache_parser)
    cache_parser.set_defaults(func=cmd_cache)
    from .envs.command import add_arguments as add_envs_arguments

    envs_parser = sub.add_parser("envs", help="SWE-bench task environments built here from the official specs: "
                                              "`uni-agent envs build DATA.parquet`")
    add_envs_arguments(envs_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RunInterrupted as stop:
        print(stop, file=sys.stderr)
        return stop.exit_status
    except UnsafeDirectory as exc:  # a private directory squatted or loose: the message says which and what to do
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        from .redact import redact

        print(f"error: {redact(f'{type(exc).__name__}: {exc}')}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
