"""Terminal-Bench 2 task folders → DIR/terminal_bench_v2_<deployment>.parquet, one row per task in the seed schema.

    python examples/data_preprocess/terminal_bench_v2.py --tasks-dir terminal-bench-2/ --local-save-dir data/ \
        --deployment podman --build-images

Each row:
- `prompt`: our system message and the task's instruction.md (with the workdir and how to finish);
- `extra_info.tools_kwargs.env`: the deployment (podman/docker: the task's image, built from environment/Dockerfile
  or environment.docker_image; local: a workspace made from the Dockerfile's COPYs, for tasks the host can stand
  in for, or with --local-images the task's image, run by bubblewrap over its root filesystem; modal:
  environment.docker_image), cpus and memory, the task's ENV, and command/sandbox lifetimes that
  fit the task's timeouts;
- `extra_info.tools_kwargs.interaction.episode_timeout`: [agent] timeout_sec, the whole episode's wall clock;
- `extra_info.tools_kwargs.reward`: `{name: terminal_bench, eval_timeout: [verifier] timeout_sec, metadata: {task_id,
  workdir, tests_archive, solution_archive (base64 tar.gz), timeouts, verifier_env, solution_env, task_toml}}`.
  The tests and the solution travel only inside the row: they reach a sandbox at verification time, never before.

A task folder that cannot be read, or that the deployment cannot run, is reported by name and left out.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import ConfigError
from ..tasks.rows import seed_row
from . import BUNDLED_TASKS_DIR, DATA_SOURCE, REWARD_NAME
from .dockerfile import materialize_workspace
from .images import build_image, image_tag
from .task import LoadedTask, b64, load_task, task_folders
from ..grading.terminal_bench import COMMAND_OVERHEAD_S

DEPLOYMENTS = ("podman", "docker", "local", "modal")
SANDBOX_LIFETIME_MARGIN_S = 600.0  # the sandbox outlives the agent + verifier timeouts by this much

SYSTEM_PROMPT = (
    "You are an expert at working in a Linux terminal. You act through the tools you are given, one step at a time, "
    "and you check the effect of each command."
)
USER_PROMPT = """You are in a Linux machine prepared for the task below; the files and tools it mentions are in place.
Your commands run in {workdir}.

<task>
{instruction}
</task>

You have {agent_timeout:g} seconds in all. When the task is done, call `submit`. A hidden verifier then checks the
result; the changes you made under {workdir} are what it sees."""

# Container rows: the workdir's starting state is committed once, so the agent's changes can be collected as a diff.
GIT_BASELINE = ("command -v git >/dev/null || { echo 'terminal_bench rows need git in the image' >&2; exit 1; }; "
                "cd WORKDIR && if [ ! -d .git ]; then git init -q && git add -A && "
                "git commit -q --allow-empty --no-verify -m 'uni-agent base snapshot'; fi")


@dataclass
class TaskProblem:
    task_id: str
    error: str

    def __str__(self) -> str:
        return self.error if self.error.startswith(f"task {self.task_id}") else f"task {self.task_id}: {self.error}"


def _deployment(task: LoadedTask, deployment: str, image: str | None, workspace: Path | None) -> dict[str, Any]:
    cfg = task.config
    agent_s, verifier_s = cfg.agent.timeout_sec, cfg.verifier.timeout_sec
    timing = {
        "runtime_timeout": max(agent_s, verifier_s) + COMMAND_OVERHEAD_S,
        "deployment_timeout": agent_s + verifier_s + SANDBOX_LIFETIME_MARGIN_S,
    }
    memory_mb = cfg.environment.memory_limit_mb()
    internet = cfg.environment.allow_internet
    if deployment == "local" and image is not None:  # bubblewrap over the task's image: no container runtime
        return {"type": "local", "image": image, "workdir": task.workdir, "network": internet, **timing}
    if deployment == "local":
        return {"type": "local", "repo": str(workspace), "workdir": task.workdir, "network": internet, **timing}
    if deployment == "modal":
        out = {"type": "modal", "image": image, "workdir": task.workdir, "block_network": not internet, **timing}
        return out | ({"cpu": cfg.environment.cpus} if cfg.environment.cpus else {}) | (
            {"memory": memory_mb} if memory_mb else {})
    out = {"type": deployment, "image": image, "workdir": task.workdir,
           "pull": "missing" if cfg.environment.docker_image else "never",
           "network": "bridge" if internet else "none", **timing}
    return out | ({"cpus": cfg.environment.cpus} if cfg.environment.cpus else {}) | (
        {"memory": f"{memory_mb}m"} if memory_mb else {})


def task_to_row(task: LoadedTask, deployment: str, agent_name: str, image: str | None = None,
                workspace: Path | None = None) -> dict[str, Any]:
    cfg = task.config
    env_variables = dict(cfg.environment.env)
    on_host = deployment == "local" and image is None
    if on_host:  # an image carries its Dockerfile's ENV; the host does not
        env_variables = {**task.dockerfile.env, **env_variables}
    env: dict[str, Any] = {
        "deployment": _deployment(task, deployment, image, workspace),
        "post_setup_cmd": "" if on_host else GIT_BASELINE.replace("WORKDIR", shlex.quote(task.workdir)),
    }
    if env_variables:  # an empty mapping would be a struct with no fields, which Parquet cannot store
        env["env_variables"] = env_variables
    metadata = {
        "task_id": task.task_id,
        "workdir": task.workdir,
        "tests_archive": b64(task.tests_archive),
        "solution_archive": b64(task.solution_archive) if task.solution_archive else "",
        "agent_timeout_sec": cfg.agent.timeout_sec,
        "verifier_timeout_sec": cfg.verifier.timeout_sec,
        "build_timeout_sec": cfg.environment.build_timeout_sec,
        "verifier_env": json.dumps(cfg.verifier.env),  # JSON strings: every row has the same Parquet type
        "solution_env": json.dumps(cfg.solution.env),
        "task_toml": task.toml_text,
    }
    user = USER_PROMPT.format(workdir=task.workdir, instruction=task.instruction, agent_timeout=cfg.agent.timeout_sec)
    row = seed_row(task.task_id, DATA_SOURCE, agent_name, SYSTEM_PROMPT, user, env=env,
                   reward={"name": REWARD_NAME, "eval_timeout": cfg.verifier.timeout_sec, "metadata": metadata,
                           "in_agent_sandbox": True})
    row["extra_info"]["tools_kwargs"]["interaction"] = {"episode_timeout": cfg.agent.timeout_sec}
    return row


def _image_for(task: LoadedTask, deployment: str, build: bool, build_args: dict[str, str],
               build_network: str | None) -> str:
    """The task's image: its published one, or the tag of the one built here (local images are built by podman)."""
    prebuilt = task.config.environment.docker_image
    if deployment == "modal":
        if not prebuilt:
            raise ConfigError(f"task {task.task_id}: modal needs environment.docker_image (Modal pulls from a "
                              f"registry; it cannot use an image built here)")
        return prebuilt
    if prebuilt:
        return prebuilt
    tag = image_tag(task, build_args)
    if build:
        build_image(task, tag, cli="podman" if deployment == "local" else deployment, build_args=build_args,
                    network=build_network)
    return tag


def convert_tasks(tasks_dir: Path | None, out_dir: Path, deployment: str = "podman", agent_name: str = "swe_agent",
                  build: bool = False, build_args: dict[str, str] | None = None, build_network: str | None = None,
                  max_tasks: int | None = None, local_images: bool = False) -> tuple[Path, int, list[TaskProblem]]:
    """Write the rows; returns (parquet path, rows written, tasks left out with why). With `local_images`, local
    rows name the task's image (bubblewrap runs it, see sandbox/image_store.py) instead of a host workspace."""
    if deployment not in DEPLOYMENTS:
        raise ConfigError(f"unknown deployment {deployment!r}; choose one of {DEPLOYMENTS}")
    tasks_dir = (tasks_dir or BUNDLED_TASKS_DIR).expanduser().resolve()
    out_dir = out_dir.expanduser().resolve()
    out_path = out_dir / f"{DATA_SOURCE}_{deployment}.parquet"
    workspaces = out_dir / f"{DATA_SOURCE}_workspaces"
    rows, problems = [], []
    for folder in task_folders(tasks_dir):
        if max_tasks is not None and len(rows) >= max_tasks:
            break
        try:
            task = load_task(folder)
            if task.config.environment.gpus and deployment != "modal":
                raise ConfigError(f"task {task.task_id}: needs {task.config.environment.gpus} GPU(s), which the "
                                  f"{deployment} backend does not give a sandbox")
            image, workspace = None, None
            if deployment == "local" and not local_images:
                if not task.dockerfile.host_compatible:
                    raise ConfigError(f"task {task.task_id}: needs its image, the host cannot stand in for it "
                                      f"(environment/Dockerfile {'; '.join(task.dockerfile.host_blockers)}); "
                                      f"use --deployment podman, or local with --local-images")
                workspace = workspaces / task.task_id
                shutil.rmtree(workspace, ignore_errors=True)
                materialize_workspace(task.dockerfile, folder / "environment", workspace)
            else:
                image = _image_for(task, deployment, build, build_args or {}, build_network)
            rows.append(task_to_row(task, deployment, agent_name, image, workspace))
            if task.unused_keys:
                print(f"note: task {task.task_id}: task.toml keys not used here: {', '.join(task.unused_keys)}",
                      file=sys.stderr)
        except ConfigError as exc:
            problems.append(TaskProblem(folder.name, str(exc)))
    if not rows:
        raise ConfigError(f"{tasks_dir}: no task could be converted: " + "; ".join(map(str, problems)))
    out_dir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out_path)
    return out_path, len(rows), problems


def _build_arg(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ValueError(f"--build-arg wants KEY=VALUE, got {text!r}")
    return key, value


def add_arguments(parser: Any) -> None:
    parser.add_argument("--tasks-dir", help="a directory of Terminal-Bench 2 task folders (default: the bundled ones)")
    parser.add_argument("--local-save-dir", default="~/data/terminal_bench",
                        help="where terminal_bench_v2_<deployment>.parquet (and, for local, the task workspaces) go")
    parser.add_argument("--deployment", choices=DEPLOYMENTS, default="podman",
                        help="podman/docker: the task images; local: bubblewrap on this host, for tasks whose "
                             "Dockerfile only COPYs files into the workdir; modal: environment.docker_image")
    parser.add_argument("--build-images", action="store_true",
                        help="podman/docker: build each task's image from environment/Dockerfile now (skipped when "
                             "the tag already exists)")
    parser.add_argument("--build-arg", action="append", default=[], type=_build_arg, metavar="KEY=VALUE",
                        help="passed to every image build (and part of the image tag), e.g. BASE_IMAGE=...")
    parser.add_argument("--build-network", help="--network for the builds (e.g. none)")
    parser.add_argument("--local-images", action="store_true",
                        help="local: each row names the task's image (published, or built with podman by "
                             "--build-images), run by bubblewrap over the image's root filesystem")
    parser.add_argument("--agent-name", default="swe_agent", help="agent_name of every row")
    parser.add_argument("--max-tasks", type=int, help="convert at most K tasks")


def run_cli(args: Any) -> int:
    try:
        path, count, problems = convert_tasks(
            Path(args.tasks_dir) if args.tasks_dir else None, Path(args.local_save_dir), args.deployment,
            args.agent_name, args.build_images, dict(args.build_arg), args.build_network, args.max_tasks,
            getattr(args, "local_images", False))  # callers may build args without the newer flag
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"skipped {problem}", file=sys.stderr)
    print(f"wrote {count} tasks to {path}" + (f" ({len(problems)} task folders skipped)" if problems else ""))
    return 0
