"""The environments of many rows, built in parallel, and the rows pointed at them: what `uni-agent envs build`
(command.py) and a run's first use (first_use.py) share. One line per environment and repository says what happened
and how long it took."""

from __future__ import annotations

import copy
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..swebench.spec import ENV_PREBUILT
from .build import BuildError, Built, GitSource, build_env, prepare_repo
from .plan import Plan

MB = 1024 * 1024


def build_all(plan: Plan, source: GitSource, root: Path, jobs: int) -> tuple[dict[int, Built], list[str]]:
    """Every environment, then every repository once its environment is there, `jobs` at a time."""
    repos: dict[int, Built] = {}
    failures: list[str] = []
    with ThreadPoolExecutor(jobs) as pool:
        env_futures: dict[str, Future[Built]] = {}
        for key, env in plan.envs.items():
            say(f"{env.label}: building its environment (Python {env.python}, setup commit {env.setup_commit[:12]})")
            env_futures[key] = pool.submit(build_env, env, source, root)
        repo_futures: dict[int, Future[Built]] = {}
        keys = {future: key for key, future in env_futures.items()}
        for future in as_completed(keys):  # each environment's line as soon as it is done
            key = keys[future]
            try:
                env_built = future.result()
            except (BuildError, ConfigError, OSError) as exc:
                failures.append(f"{plan.envs[key].label}: {exc}")
                say(f"{plan.envs[key].label}: FAILED (see the error at the end)")
                continue
            say(f"{env_built.name}: environment {'cached' if env_built.cached else 'built'} "
                f"in {env_built.seconds:.1f} s, {env_built.disk_bytes / MB:.0f} MB ({env_built.path})")
            for index, instance in plan.instances.items():
                if instance.env.key == key:
                    repo_futures[index] = pool.submit(prepare_repo, instance, env_built, source, root)
        for index, future in repo_futures.items():
            name = plan.instances[index].instance_id
            try:
                repos[index] = future.result()
            except (BuildError, ConfigError, OSError) as exc:
                failures.append(f"{name}: {exc}")
                continue
            built = repos[index]
            say(f"{name}: repository {'cached' if built.cached else 'prepared'} in {built.seconds:.1f} s, "
                f"{built.disk_bytes / MB:.0f} MB")
    return repos, failures


def with_environment(row: dict[str, Any], built: Built) -> dict[str, Any]:
    """The row pointed at its prepared repository and environment; nothing else changes."""
    row = copy.deepcopy(row)
    tools = row["extra_info"]["tools_kwargs"]
    deployment = tools["env"]["deployment"]
    deployment["repo"] = built.path
    deployment["mounts"] = {**(deployment.get("mounts") or {}), **built.mounts}
    tools["reward"]["metadata"][ENV_PREBUILT] = "1"
    return row


def say(line: str) -> None:
    print(f"[envs {time.strftime('%H:%M:%S')}] {line}", flush=True)
