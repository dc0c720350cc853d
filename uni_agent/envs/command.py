"""`uni-agent envs build DATA.parquet`: every environment the rows need, built in parallel, then each row's
repository, then the rows rewritten to use them:

    uni-agent envs build data/swe_bench_verified_local.parquet --git-mirror /work/.mirror [--jobs 4] [--out FILE]
    uni-agent envs prune [--older-than 30]     what no build asked for in 30 days, removed

A row gets `repo` (its prepared repository), `mounts` (the environment at /opt/miniconda3, the interpreter at its
own path) and `reward.metadata.env_prebuilt: "1"` (the eval script skips the install step). Rows that cannot get
an environment are reported with why and written unchanged. One line per environment and repository says what
happened and how long it took; the last line says where the rows went. Exit 1 when any build failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..config import ConfigError
from .batch import MB, build_all, say, with_environment
from .build import GitSource, envs_root, prune_unused
from .plan import plan_rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="envs_command", required=True)
    build = sub.add_parser("build", help="build the environments of SWE-bench rows and point the rows at them")
    build.add_argument("data_path", help="Parquet rows (uni-agent preprocess-swe --deployment local --local-repos)")
    build.add_argument("--out", help="where the rewritten rows go (default: DATA with _envs before .parquet)")
    build.add_argument("--git-mirror", help="directory of git mirrors (<owner>+<name>/repo, <owner>+<name> or "
                                            "<owner>__<name>); default: clone from GitHub into the cache")
    build.add_argument("--jobs", type=int, default=4, help="builds at once (default 4)")
    build.add_argument("--constraint", help="a pip constraints file for every install of the builds, e.g. pins for "
                                            "packages released after the official images were built")
    build.set_defaults(func=cmd_envs)
    prune = sub.add_parser("prune", help="remove the environments and repositories no `envs build` asked for lately")
    prune.add_argument("--older-than", type=float, default=30.0, metavar="DAYS",
                       help="remove what no build asked for in DAYS (default 30; 0: everything)")
    prune.set_defaults(func=cmd_prune)


def cmd_envs(args: argparse.Namespace) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = Path(args.data_path)
    if not data.is_file():
        raise ConfigError(f"{data}: no such file")
    rows = pq.read_table(data).to_pylist()
    out = Path(args.out) if args.out else data.with_name(f"{data.stem}_envs.parquet")
    constraints = Path(args.constraint).read_text() if args.constraint else ""
    plan = plan_rows(rows, constraints=constraints)
    for problem in plan.problems:
        say(f"left as it is: {problem}")
    root = envs_root()
    source = GitSource(root, Path(args.git_mirror).expanduser().resolve() if args.git_mirror else None)
    repos, failures = build_all(plan, source, root, max(1, args.jobs))
    written = [with_environment(row, repos[index]) if index in repos else row for index, row in enumerate(rows)]
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(pa.Table.from_pylist(written), tmp)
    tmp.replace(out)
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    say(f"{len(repos)} of {len(rows)} rows have their environment; rows written to {out}")
    return 1 if failures else 0


def cmd_prune(args: argparse.Namespace) -> int:
    root = envs_root()
    pruned = prune_unused(args.older_than, root)
    say(f"removed {pruned.envs} environments and {pruned.repos} repositories, freed {pruned.bytes / MB:.0f} MB "
        f"({root}); rows that named them need `uni-agent envs build` again")
    return 0
