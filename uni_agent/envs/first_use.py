"""Environments on first use (the run setting `build_envs`, `--build-envs`): before a run or a verification starts,
the SWE-bench rows of the local backend get the environment and repository `uni-agent envs build` would make (cached
per user: only the first run of a (repo, version) builds), and are pointed at them in memory; the rows file is left
as it is. Rows of other kinds pass through unchanged. A build that fails stops the run before anything starts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..config import ConfigError
from .batch import build_all, say, with_environment
from .build import GitSource, envs_root
from .plan import plan_rows


def with_environments(rows: list[dict[str, Any]], *, git_mirror: str | None = None) -> list[dict[str, Any]]:
    """`rows` with every SWE-bench row of the local backend pointed at its built environment and repository, built
    half as many at a time as this process has CPUs."""
    plan = plan_rows(rows)
    if not plan.instances:
        return rows
    root = envs_root()
    source = GitSource(root, Path(git_mirror).expanduser().resolve() if git_mirror else None)
    jobs = max(1, len(os.sched_getaffinity(0)) // 2)
    say(f"build_envs: {len(plan.instances)} rows need {len(plan.envs)} environments (cached under {root})")
    repos, failures = build_all(plan, source, root, jobs)
    if failures:
        raise ConfigError("build_envs: " + "; ".join(failures)[:4000])
    return [with_environment(row, repos[index]) if index in repos else row for index, row in enumerate(rows)]
