"""A killed `uni-agent bench` takes its processes with it (issue 40: a 100,000-rollout simulation killed by `timeout`
left its scheduler, workers and driver running, and the next invocation started at load 15 with 20 GB in use).

Each test starts a small real bench (real dask processes, real sandboxes for the sweep), waits until it is mid-run,
kills it the way it happens in practice, and then checks that no process it started is left: every process of its
tree just before the kill (pid and start time, so a reused pid does not count) and every process that carries the
test's marker in its environment (which catches one started after the snapshot; sandboxes clear their environment,
the snapshot holds them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

MARK = "BENCH_KILL_TEST_MARK"  # not UNI_AGENT_*: a run refuses settings it does not know
UNI_AGENT = str(Path(sys.executable).parent / "uni-agent")


def _marked(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.environ().get(MARK) == token:
                found.append(proc)
    return found


def _tree(root: psutil.Process) -> list[psutil.Process]:
    with contextlib.suppress(psutil.Error):
        return [root, *root.children(recursive=True)]
    return []


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    """The ones still running (is_running compares the start time too: a reused pid is not ours)."""
    return [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def _describe(procs: list[psutil.Process]) -> str:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
    return "; ".join(out)


def _kill_bench_midway(argv: list[str], tmp_path: Path, ready, kill) -> tuple[list[psutil.Process], str, str]:  # noqa: ANN001
    """Starts the bench in its own process group, waits until `ready(tree)` says it is mid-run, `kill(pid)`, waits
    for its exit; returns what is left of it after up to 30 s, its output and the tree it had."""
    token = uuid.uuid4().hex
    log = tmp_path / "bench.log"
    with open(log, "w") as out:
        bench = subprocess.Popen(argv, env={**os.environ, MARK: token}, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    root = psutil.Process(bench.pid)
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 240
        while not ready(tree := _tree(root)):
            assert bench.poll() is None, f"the bench ended before it was killed: {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the bench did not get going: {log.read_text()[-3000:]}"
            time.sleep(0.2)
        tree = _tree(root)
        described = _describe(tree)
        kill(bench.pid)
        bench.wait(timeout=120)
        left: list[psutil.Process] = []
        deadline = time.monotonic() + 30
        while (left := _alive(tree) + [p for p in _marked(token) if p not in tree]) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left, log.read_text(), described
    finally:
        for proc in _tree(root)[1:] + _marked(token) + tree:  # a failing test must not leak them either
            with contextlib.suppress(psutil.Error):
                proc.kill()
        with contextlib.suppress(ProcessLookupError):
            bench.kill()
        bench.wait()


def _sim_mid_run(tree: list[psutil.Process]) -> bool:
    """The driver (`uni-agent run`) has run for 3 s: every process of the point is up and rollouts are running."""
    for proc in tree:
        with contextlib.suppress(psutil.Error):
            if "--data-path" in proc.cmdline() and time.time() - proc.create_time() > 3:
                return True
    return False


SIM = ["bench", "--simulate", "--in-flight", "8", "--workers", "2", "--delay-s", "2", "--turns", "4",
       "--endpoint-processes", "2"]


@pytest.mark.parametrize("how", ["timeout", "sigkill"])
def test_a_killed_simulation_leaves_no_process(tmp_path, how):
    """`timeout` signals the bench's process group (the dask processes and the driver run in sessions of their own,
    which it does not reach); SIGKILL of the bench alone gives it no chance to clean up at all."""
    out = tmp_path / "out"
    if how == "timeout":
        kill = lambda pid: os.killpg(pid, signal.SIGTERM)  # noqa: E731
    else:
        kill = lambda pid: os.kill(pid, signal.SIGKILL)  # noqa: E731
    left, log, tree = _kill_bench_midway([UNI_AGENT, *SIM, "--out", str(out)], tmp_path, _sim_mid_run, kill)
    assert "dask scheduler" in tree and "dask worker" in tree and "run --data-path" in tree, tree  # all were up
    assert not left, f"left running after the bench was killed ({how}): {_describe(left)}\nbench output: {log[-2000:]}"
    if how == "timeout":
        assert "SIGTERM" in log, log[-2000:]  # it says why it stopped


def test_a_killed_sweep_leaves_no_process(tmp_path):
    """The rollout sweep: a LocalCluster's worker processes, their fork servers (bwrap) and the endpoint process;
    SIGTERM to the bench process alone, as `kill PID` sends it, in the middle of a wave."""
    out = tmp_path / "out"

    def ready(tree: list[psutil.Process]) -> bool:
        """A sandbox below a worker's fork server: rollouts are running. A worker's fork server (bwrap, then the
        fork server's python) is up from the worker's start (warmed before the wave), and the bench's own, for its
        "start alone" figure, is the bench's child: a sandbox is a child of the fork server's python."""
        pids = {p.pid: p for p in tree}
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                fork_server = pids.get(proc.ppid())
                bwrap = pids.get(fork_server.ppid()) if fork_server is not None else None
                if bwrap is None or bwrap.name() != "bwrap" or fork_server.name() == "bwrap":
                    continue
                outer = bwrap
                while outer.ppid() in pids and pids[outer.ppid()].name() == "bwrap":
                    outer = pids[outer.ppid()]
                if pids.get(outer.ppid()) not in (None, tree[0]):  # below a worker, not the bench itself
                    return True
        return False

    argv = [UNI_AGENT, "bench", "--concurrency", "4", "--workers", "1", "--turns", "4", "--delay-s", "1",
            "--waves", "3", "--no-peer", "--out", str(out)]
    left, log, tree = _kill_bench_midway(argv, tmp_path, ready, lambda pid: os.kill(pid, signal.SIGTERM))
    assert "bwrap" in tree, tree
    assert not left, f"left running after the bench was killed: {_describe(left)}\nbench output: {log[-2000:]}"
    assert "SIGTERM" in log, log[-2000:]


def test_the_stop_line_reaches_the_console_while_stderr_is_captured():
    """A sweep point holds the run's stderr in a buffer (bench/ours.py); a SIGTERM that lands then must still say on
    the process's own stderr why the bench stopped (CI lost it once: the kill came before the run call)."""
    script = (
        "import contextlib, io, os, signal\n"
        "from uni_agent.bench.lifetime import stop_on_signals\n"
        "stop_on_signals()\n"
        "buffer = io.StringIO()\n"
        "try:\n"
        "    with contextlib.redirect_stderr(buffer):\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "finally:\n"
        "    print('captured:', repr(buffer.getvalue()))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 128 + signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
    assert "uni-agent bench: SIGTERM: stopping" in done.stderr, done.stderr
    assert "captured: ''" in done.stdout, done.stdout  # nothing of it went into the buffer
