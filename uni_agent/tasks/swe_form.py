"""Tasks in SWE-bench instance form (an `instance.json` plus a `repo/` snapshot at the base state) → dataset rows.

The bundled tasks live in `uni_agent/tasks/bundled/`; a user's own tasks use the same layout in any directory.

Two shapes of task are accepted: SWE-bench's (the hidden tests come in `test_patch`) and SWE-smith's (the bug was
injected into the source, FAIL_TO_PASS are tests already in `repo/`, `test_patch` is empty or absent: no test
changes). FAIL_TO_PASS / PASS_TO_PASS may be lists or JSON-encoded strings, as the official datasets store them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import ConfigError
from .rows import seed_row, test_list

BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"
REQUIRED_FIELDS = ("instance_id", "problem_statement", "patch", "FAIL_TO_PASS", "PASS_TO_PASS")
# `test_patch` is optional: empty or absent means "no test changes" (the tests are already in repo/).

SYSTEM_PROMPT = (
    "You are a careful software engineer working in a sandboxed Linux machine through tools. "
    "You cannot reach the network. Keep each step small and check what you did."
)

USER_PROMPT = """A Python repository is checked out at {workdir}. A user reported the issue below.

<issue>
{problem_statement}
</issue>

Change the non-test source files in {workdir} so that the issue is fixed. Hidden tests will check your change;
do not edit existing tests. A good way to work:
1. Look at the code involved (`str_replace_editor` with `view`, or `execute_bash` with grep/ls).
2. Reproduce the problem with a short script run via `execute_bash` (python is available).
3. Make the smallest correct fix with `str_replace_editor`.
4. Run the reproduction again and the existing tests (`python -m pytest -q`).
5. Call `submit` when you are done."""


def load_instance(task_dir: Path) -> dict[str, Any]:
    path = task_dir / "instance.json"
    try:
        instance = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{task_dir}: no instance.json") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None
    if not isinstance(instance, dict):
        raise ConfigError(f"{path}: expected a JSON object of fields, got {type(instance).__name__}")
    missing = [f for f in REQUIRED_FIELDS if f not in instance]
    if missing:
        raise ConfigError(f"{path}: missing fields {missing}")
    for name in ("instance_id", "problem_statement", "patch"):
        if not isinstance(instance[name], str) or not instance[name].strip():
            raise ConfigError(f"{path}: {name} must be a non-empty string")
    if instance.get("test_patch") is None:
        instance["test_patch"] = ""
    elif not isinstance(instance["test_patch"], str):
        raise ConfigError(f"{path}: test_patch must be a string (a unified diff, or empty for no test changes)")
    for name in ("FAIL_TO_PASS", "PASS_TO_PASS"):
        try:
            instance[name] = test_list(instance[name], name)
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    if "test_cmd" in instance and (not isinstance(instance["test_cmd"], str) or not instance["test_cmd"].strip()):
        raise ConfigError(f"{path}: test_cmd must be a non-empty string (the command the tests run with)")
    if not instance["FAIL_TO_PASS"]:
        raise ConfigError(f"{path}: FAIL_TO_PASS is empty: there is nothing to grade")
    if not (task_dir / "repo").is_dir():
        raise ConfigError(f"{task_dir}: no repo/ directory (the repository at its base state)")
    return instance


def task_dirs(tasks_dir: Path) -> list[Path]:
    dirs = sorted(p for p in tasks_dir.iterdir() if (p / "instance.json").exists())
    if not dirs:
        raise ConfigError(f"{tasks_dir}: no task directories (each needs instance.json and repo/)")
    return dirs


def instance_to_row(instance: dict[str, Any], repo_ref: str, agent_name: str, workdir: str = "/testbed") -> dict:
    metadata = {
        "instance_id": instance["instance_id"],
        "repo": instance.get("repo", ""),
        "version": str(instance.get("version", "")),
        "base_commit": instance.get("base_commit", ""),
        "patch": instance["patch"],
        "test_patch": instance.get("test_patch") or "",
        # JSON strings, as in the official dataset, so every row has the same Parquet type.
        "FAIL_TO_PASS": json.dumps(test_list(instance["FAIL_TO_PASS"], "FAIL_TO_PASS")),
        "PASS_TO_PASS": json.dumps(test_list(instance["PASS_TO_PASS"], "PASS_TO_PASS")),
    }
    if instance.get("test_cmd"):  # the grader's command instead of its default (swe_local.DEFAULT_TEST_CMD)
        metadata["test_cmd"] = instance["test_cmd"]
    user = USER_PROMPT.format(workdir=workdir, problem_statement=instance["problem_statement"].strip())
    return seed_row(
        instance["instance_id"], "uni-agent/bundled" if repo_ref.startswith("bundled:") else "uni-agent/local",
        agent_name, SYSTEM_PROMPT, user,
        env={"deployment": {"type": "local", "repo": repo_ref, "workdir": workdir}, "post_setup_cmd": ""},
        reward={"name": "swe_local", "metadata": metadata},
    )


def convert(tasks_dir: Path | None, out_path: Path, agent_name: str = "swe_agent") -> int:
    """Write the tasks under `tasks_dir` (default: the bundled ones) as a Parquet file; returns the row count."""
    bundled = tasks_dir is None
    tasks_dir = BUNDLED_DIR if tasks_dir is None else tasks_dir.resolve()
    rows = []
    for task_dir in task_dirs(tasks_dir):
        instance = load_instance(task_dir)
        repo_ref = f"bundled:{task_dir.name}" if bundled else str(task_dir / "repo")
        rows.append(instance_to_row(instance, repo_ref, agent_name))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), out_path)
    return len(rows)
