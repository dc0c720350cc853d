"""parallel_verify.py on all bundled tasks: the gold patch resolves every task, the empty patch none.

Run as a user would: the example script in a subprocess, once on its own LocalCluster and once against a real
`dask scheduler` + `dask worker` started from the command line (--scheduler-file)."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from uni_agent.tasks.swe_form import BUNDLED_DIR

SCRIPT = REPO_ROOT / "examples" / "agent_interaction" / "parallel_verify.py"
BUNDLED_IDS = sorted(p.parent.name for p in BUNDLED_DIR.glob("*/instance.json"))
DASK = str(Path(sys.executable).parent / "dask")


def _verify(out: Path, patch: str, *extra: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--patch", patch, "--output-dir", str(out), *extra],
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(proc.stdout[proc.stdout.index("{"):])
    return summary


def test_gold_resolves_every_bundled_task(tmp_path):
    summary = _verify(tmp_path, "gold")
    assert summary["num_tasks"] == len(BUNDLED_IDS) >= 12
    assert summary["resolved_ids"] == BUNDLED_IDS, summary
    assert summary["avg_at_n"] == 1.0 and summary["resolved"] == len(BUNDLED_IDS)
    for key in ("num_tasks", "n", "num_rollouts", "avg_at_n", "resolved", "exit_reasons", "wall_seconds"):
        assert key in summary


@pytest.fixture
def dask_processes(tmp_path):
    """A real `dask scheduler` and one `dask worker` with a SANDBOX resource, as on a cluster."""
    scheduler_file = tmp_path / "scheduler.json"
    procs = [subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                               "--scheduler-file", str(scheduler_file)], stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 60
    while not scheduler_file.exists():
        assert time.monotonic() < deadline, "dask scheduler did not write its scheduler file"
        time.sleep(0.1)
    procs.append(subprocess.Popen([DASK, "worker", "--scheduler-file", str(scheduler_file), "--nthreads", "4",
                                   "--resources", "SANDBOX=8", "--no-dashboard"], stderr=subprocess.DEVNULL))
    yield scheduler_file
    for proc in reversed(procs):
        proc.terminate()
        proc.wait(30)


def test_empty_resolves_none_on_a_command_line_cluster(tmp_path, dask_processes):
    summary = _verify(tmp_path / "out", "empty", "--scheduler-file", str(dask_processes))
    assert summary["resolved"] == 0 and summary["avg_at_n"] == 0.0
    assert summary["wrong_answer_ids"] == BUNDLED_IDS
    results = __import__("pandas").read_parquet(tmp_path / "out" / "verify_empty.parquet")
    assert (results.status == "unresolved").all() and results.patch_applied.all()
