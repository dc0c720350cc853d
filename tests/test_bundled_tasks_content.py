"""Content checks for the bundled SWE-bench-style tasks in ``uni_agent/tasks/bundled``.

For every task this verifies the ``instance.json`` schema and then replays the task the way an
evaluator does: copy the base repository, apply ``test_patch`` and check that the FAIL_TO_PASS
tests fail while the PASS_TO_PASS tests pass, then apply the gold ``patch`` and check that all of
them pass.  Only the standard library, ``git`` and ``sys.executable -m pytest`` are used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BUNDLED_DIR = Path(__file__).resolve().parents[1] / "uni_agent" / "tasks" / "bundled"
TASK_DIRS = sorted(p for p in BUNDLED_DIR.iterdir() if p.is_dir()) if BUNDLED_DIR.is_dir() else []

MIN_TASKS = 12
REQUIRED_FIELDS = {
    "instance_id": str,
    "repo": str,
    "version": str,
    "base_commit": str,
    "created_at": str,
    "problem_statement": str,
    "hints_text": str,
    "patch": str,
    "test_patch": str,
    "FAIL_TO_PASS": list,
    "PASS_TO_PASS": list,
}
INSTANCE_ID_RE = re.compile(r"^uni-agent__[a-z0-9_]+-\d+$")
NODE_ID_RE = re.compile(r"^tests/[\w/]+\.py::test_\w+$")
SUMMARY_RE = re.compile(r"^(PASSED|FAILED|ERROR) (\S+)", re.MULTILINE)
DIFF_HEADER_RE = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)
FORBIDDEN_IN_REPO = {".git", "__pycache__", ".pytest_cache"}

GIT = [
    "git",
    "-c", "user.name=uni-agent-tests",
    "-c", "user.email=tests@uni-agent.invalid",
    "-c", "commit.gpgsign=false",
    "-c", "core.autocrlf=false",
    "-c", "init.defaultBranch=main",
]


def _load(task_dir: Path) -> dict:
    return json.loads((task_dir / "instance.json").read_text(encoding="utf-8"))


def _diff_paths(diff: str) -> set[str]:
    paths = set()
    for a_path, b_path in DIFF_HEADER_RE.findall(diff):
        paths.update((a_path, b_path))
    return paths


def _git(cwd: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run(GIT + list(args), cwd=cwd, input=stdin, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"git {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result


def _run_pytest(repo: Path, test_files: list[str]) -> tuple[dict[str, str], str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTEST_ADDOPTS", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *test_files],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    statuses: dict[str, str] = {}
    for status, node_id in SUMMARY_RE.findall(result.stdout):
        # a test that passes but errors in teardown shows up twice; never let PASSED hide an error
        if statuses.get(node_id) in ("FAILED", "ERROR"):
            continue
        statuses[node_id] = status
    return statuses, output


def test_enough_tasks_with_unique_ids():
    assert len(TASK_DIRS) >= MIN_TASKS, f"expected at least {MIN_TASKS} bundled tasks, found {len(TASK_DIRS)}"
    ids = [_load(d)["instance_id"] for d in TASK_DIRS]
    assert len(ids) == len(set(ids)), "instance ids must be unique"
    repos = [_load(d)["repo"] for d in TASK_DIRS]
    assert len(repos) == len(set(repos)), "every task should come from a distinct repository"


def test_mix_of_test_patch_kinds():
    """Some test patches add a new test file, others extend an existing one."""
    adds_file = [("--- /dev/null" in _load(d)["test_patch"]) for d in TASK_DIRS]
    assert any(adds_file) and not all(adds_file)


@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=[d.name for d in TASK_DIRS])
def test_instance_metadata(task_dir: Path):
    instance = _load(task_dir)
    for field, expected_type in REQUIRED_FIELDS.items():
        assert field in instance, f"missing field {field!r}"
        assert isinstance(instance[field], expected_type), f"{field!r} should be {expected_type.__name__}"

    assert instance["instance_id"] == task_dir.name
    assert INSTANCE_ID_RE.match(instance["instance_id"]), instance["instance_id"]
    assert instance["version"] == "1.0"
    assert instance["base_commit"] == "bundled"
    assert instance["problem_statement"].strip()
    assert instance["patch"].strip() and instance["test_patch"].strip()

    f2p, p2p = instance["FAIL_TO_PASS"], instance["PASS_TO_PASS"]
    assert 1 <= len(f2p) <= 3
    assert len(p2p) >= 2
    for node_id in f2p + p2p:
        assert isinstance(node_id, str) and NODE_ID_RE.match(node_id), node_id
    assert len(set(f2p + p2p)) == len(f2p) + len(p2p), "FAIL_TO_PASS and PASS_TO_PASS must be disjoint"

    patch_paths = _diff_paths(instance["patch"])
    assert patch_paths, "patch has no file headers"
    assert not any(p.startswith("tests/") or "/tests/" in p for p in patch_paths), patch_paths
    test_patch_paths = _diff_paths(instance["test_patch"])
    assert test_patch_paths and all(p.startswith("tests/") for p in test_patch_paths), test_patch_paths

    repo = task_dir / "repo"
    assert repo.is_dir() and (repo / "tests").is_dir()
    leftovers = [p for p in repo.rglob("*") if p.name in FORBIDDEN_IN_REPO]
    assert not leftovers, f"build/VCS leftovers in shipped repo: {leftovers}"
    for node_id in p2p:
        assert (repo / node_id.split("::")[0]).is_file(), f"PASS_TO_PASS file missing from base repo: {node_id}"


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
@pytest.mark.parametrize("task_dir", TASK_DIRS, ids=[d.name for d in TASK_DIRS])
def test_patches_flip_fail_to_pass(task_dir: Path, tmp_path: Path):
    instance = _load(task_dir)
    f2p, p2p = instance["FAIL_TO_PASS"], instance["PASS_TO_PASS"]

    repo = tmp_path / "repo"
    shutil.copytree(task_dir / "repo", repo, ignore=shutil.ignore_patterns(*FORBIDDEN_IN_REPO))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")

    test_files = sorted(
        {b_path for _, b_path in DIFF_HEADER_RE.findall(instance["test_patch"])}
        | {node_id.split("::")[0] for node_id in p2p}
    )

    _git(repo, "apply", "-", stdin=instance["test_patch"])
    statuses, output = _run_pytest(repo, test_files)
    for node_id in f2p:
        assert statuses.get(node_id) != "PASSED", f"{node_id} passes without the gold patch\n{output}"
    for node_id in p2p:
        assert statuses.get(node_id) == "PASSED", f"{node_id} does not pass on the base commit\n{output}"

    _git(repo, "apply", "-", stdin=instance["patch"])
    statuses, output = _run_pytest(repo, test_files)
    for node_id in f2p + p2p:
        assert statuses.get(node_id) == "PASSED", f"{node_id} does not pass with the gold patch\n{output}"
