"""The quickstart's path as ordinary users on a shared node: two users run it at the same time.

Each user runs `parallel_infer.py` as a new user would (its own LocalCluster with worker processes, bubblewrap
sandboxes under its own default sandbox root, verification, Parquet), beside the other. The model is a ScriptedLLM
served by the test on loopback, which applies each task's gold patch, so a run that works scores 1 on every row;
the real llama-server path is the README's first command (tests/test_e2e_llm.py runs it as root).
"""

import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import pandas as pd

from conftest import REPO_ROOT, scripted_run_inputs
from test_run_dask import solver
from unprivileged import ensure_users, popen_as, shared_dir
from uni_agent.testing.scripted_llm import ScriptedLLM

USERS = ("ua-node-a", "ua-node-b")


def _inputs() -> tuple[Path, Path]:
    """The bundled tasks as rows and an agent config with API tool calls, where every user can read them."""
    return scripted_run_inputs(shared_dir("uni-agent-shared-node-"))


def test_two_users_run_the_quickstart_path_at_once_each_in_private(tmp_path):
    users = ensure_users(USERS)
    data, config = _inputs()
    with ScriptedLLM(solver) as server:
        runs = [popen_as(user, [sys.executable, str(REPO_ROOT / "examples/agent_interaction/parallel_infer.py"),
                                "--data-path", str(data), "--agent-config-path", str(config), "--max-samples", "2",
                                "--n", "1", "--engine", "external", "--base-url", server.base_url,
                                "--model", "scripted", "--local-workers", "1", "--no-progress",
                                "--output-dir", str(user.home / "out")])
                for user in users]
        finished = [proc.communicate(timeout=420) for proc in runs]
    for user, proc, (out, err) in zip(users, runs, finished):
        assert proc.returncode == 0, f"{user.name}: {err[-3000:]}"
        assert "PermissionError" not in err, err[-3000:]
        results = pd.read_parquet(user.home / "out" / "results")
        assert len(results) == 2 and (results.failure_kind == "none").all(), results[["failure_cause"]]
        assert (results.reward == 1.0).all(), results.verification.tolist()
        summary = json.loads((user.home / "out" / "summary.json").read_text())
        assert summary["avg_at_n"] == 1.0 and summary["infra_failures"] == 0
        for part in (user.home / "out" / "results").rglob("*.parquet"):
            assert part.stat().st_uid == user.uid, part  # written by the user's own processes
        # Its sandboxes lived in its own private root (left empty: every sandbox was closed).
        root = Path(tempfile.gettempdir()) / f"uni-agent-{user.uid}" / "sandboxes"
        info = os.lstat(root)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == user.uid and stat.S_IMODE(info.st_mode) == 0o700
        assert not list(root.iterdir())
