"""A run stopped by Ctrl-C, `kill` or `scancel`: one line, the right exit status, every finished row on disk, nothing
left running, and a rerun that runs only the rest.

The run is `parallel_infer.py` as a user starts it, in a process group of its own as a terminal's foreground job (so
Ctrl-C reaches every process of the group, its worker processes included, as it does in a terminal). The model is a
ScriptedLLM that applies each task's gold patch with a delay per reply, so rollouts finish one after another while
the signal arrives.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import REPO_ROOT, assistant_turns, poll_until, scripted_run_inputs
from test_run_dask import solver
from uni_agent.testing.scripted_llm import ScriptedLLM

SCRIPT = REPO_ROOT / "examples/agent_interaction/parallel_infer.py"


@pytest.fixture
def inputs(tmp_path):
    return scripted_run_inputs(tmp_path, concurrency=2)  # rollouts finish one after another while the signal arrives


def _start(server: ScriptedLLM, data: Path, config: Path, out: Path) -> subprocess.Popen:
    argv = [sys.executable, str(SCRIPT), "--data-path", str(data), "--agent-config-path", str(config), "--n", "1",
            "--engine", "external", "--base-url", server.base_url, "--model", "scripted", "--local-workers", "1",
            "--no-progress", "--output-dir", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0,
                            cwd=REPO_ROOT)


def _rows(out: Path) -> int:
    files = list((out / "results").glob("part-*.parquet"))
    return len(pd.read_parquet(out / "results")) if files else 0


def _group_alive(pgid: int) -> list[str]:
    """Processes still in the run's process group (the driver's own group: workers, engines, sandboxes)."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(stat.parent.name)
    return alive


@pytest.mark.parametrize(("signum", "to_group"), [(signal.SIGINT, True), (signal.SIGTERM, False)],
                         ids=["ctrl-c to the terminal's group", "sigterm to the driver (scancel)"])
def test_a_stopped_run_keeps_what_finished_says_one_line_and_resumes(signum, to_group, inputs, tmp_path):
    data, config = inputs
    out = tmp_path / "out"
    total = len(pd.read_parquet(data))
    with ScriptedLLM(solver, delay_s=0.5) as server:
        proc = _start(server, data, config, out)
        try:
            # Some finished (held in memory: rows go to disk 16 at a time), some still running.
            submitted = lambda: sum(assistant_turns(body) >= 3 for body in server.requests)  # noqa: E731
            poll_until(lambda: submitted() >= 3 or proc.poll() is not None, 240, "three submitted rollouts")
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(4)  # their verification
            os.killpg(proc.pid, signum) if to_group else proc.send_signal(signum)
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 128 + signum, err[-3000:]
        recorded = _rows(out)
        assert 1 <= recorded < total, (recorded, err[-3000:])
        lines = [line for line in err.splitlines() if "recorded" in line]
        assert lines == [f"stopped by {signal.Signals(signum).name}: {recorded} rollouts recorded in {out}; rerun "
                         "the same command to resume"], err[-3000:]
        assert "Traceback" not in err and "KeyboardInterrupt" not in err and "was lost" not in err, err[-3000:]
        assert " ERROR " not in err and "- ERROR -" not in err, err[-3000:]
        poll_until(lambda: not _group_alive(proc.pid), 20, "the run's processes to be gone")

        again = _start(server, data, config, out)
        _, err = again.communicate(timeout=420)
    assert again.returncode == 0, err[-3000:]
    assert "ERROR" not in err and "Traceback" not in err, err[-3000:]  # a clean shutdown logs no error
    assert f"{recorded} already done in {out}, {total - recorded} to run" in err, err[-3000:]
    results = pd.read_parquet(out / "results")
    assert len(results) == total and not results.duplicated(["instance_id", "rollout"]).any()
    assert (results.failure_kind == "none").all(), results[["instance_id", "failure_cause"]]
