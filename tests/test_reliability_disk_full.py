"""The output dir's disk fills up in the middle of a run (a 100 KB tmpfs mounted by the test, filled to the last
byte once the first results are written). No finished rollout may be lost: while writes fail the run starts no new
rollout and keeps the finished ones in memory, retrying; space freed, it goes on. When the disk stays full the run
ends with a clear error and a spill the next run in the same output dir picks up. Mounting needs root: the tests
skip, saying so, without it.

Real processes: the session's LocalCluster, real bubblewrap sandboxes, real Parquet, and a ScriptedLLM (a real
OpenAI-compatible HTTP server, see uni_agent/testing/scripted_llm.py) that counts the rollouts it sees start.
"""

import os
import subprocess
import threading
import time
from collections import Counter

import pandas as pd
import pytest

from conftest import AGENT_CONFIG, assistant_turns, poll_until
from uni_agent import AgentConfigs, run
from uni_agent.driver import dispatch
from uni_agent.driver.results import ResultsNotWritten
from uni_agent.driver.spill import spilled_files
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

TASKS, N = 3, 2  # 6 rollouts, 2 at a time


@pytest.fixture
def tiny(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a 100 KB tmpfs for the output dir needs root")
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=100k", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if done.returncode != 0:  # root whose mounts are refused (a locked-down container): a skip, but never under CI
        (pytest.fail if os.environ.get("CI") == "true" else pytest.skip)(f"cannot mount a tmpfs here: "
                                                                          f"{done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount):
    """Write a filler file until the filesystem refuses another byte."""
    fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for size in (65536, 4096, 1):
            while True:
                try:
                    os.write(fd, b"\0" * size)
                except OSError:
                    break
    finally:
        os.close(fd)


def free(mount):
    """Space freed: the filler gone and the filesystem grown (100 KB hold little more than the run's own logs)."""
    (mount / "filler").unlink()
    subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True)


class Endpoint:
    """Two calls per rollout (a command, then submit); counts the rollouts that started (their first call). Every
    rollout after the first is held at its first call until the test lets it go (`release`)."""

    def __init__(self):
        self.started = 0
        self.calls = 0
        self.lock = threading.Lock()
        self.held = threading.Semaphore(0)

    def __call__(self, body):
        with self.lock:
            self.calls += 1
            self.started += assistant_turns(body) == 0
            hold = assistant_turns(body) == 0 and self.started > 1
        if hold:
            self.held.acquire(timeout=120)
        if assistant_turns(body) == 0:
            return tool_call_message("execute_bash", {"command": "echo looked"})
        return tool_call_message("submit", {})

    def release(self, rollouts: int = TASKS * N) -> None:
        self.held.release(rollouts)

    def idle(self) -> bool:
        """Every rollout that started has made both its calls (none is in flight at the endpoint)."""
        with self.lock:
            return self.calls == 2 * self.started


def stays(predicate, seconds: float) -> bool:
    """True when `predicate` holds all the while for `seconds` (checked every 0.1 s): the absence of an event."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not predicate():
            return False
        time.sleep(0.1)
    return True


def _agents():
    return AgentConfigs.load(AGENT_CONFIG).override_all(
        {"concurrency": 2, "interaction": {"tools_in": "api", "constrain_tool_calls": False}})


def _on_disk(out) -> int:
    files = sorted((out / "results").glob("part-*.parquet"))
    return sum(len(pd.read_parquet(f)) for f in files)


def _run_in_thread(rows, server, out, **settings):
    box: dict = {}

    def target():
        try:
            box["outcome"] = run(rows, _agents(), client=settings.pop("client"), engine="external",
                                 base_url=server.base_url, model_name="scripted", n=N, output_dir=str(out),
                                 progress=False, verify=False, flush_every=1, **settings)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, box


def _run_until_the_disk_is_full(tiny, rows, server, endpoint, capfd, **settings):  # noqa: ANN001, ANN201
    """A run in a thread until its first result is on disk; then the disk is filled and one more rollout finishes, so
    its result cannot be written; returns once the run said so (what it said so far in `said`)."""
    out = tiny / "out"
    thread, box = _run_in_thread(rows[:TASKS], server, out, **settings)
    poll_until(lambda: _on_disk(out) >= 1 or "error" in box, 120, "the first result on disk")
    fill(tiny)
    endpoint.release(1)  # one more rollout finishes: its result cannot be written
    said: list[str] = []
    poll_until(lambda: said.append(capfd.readouterr().err) or "cannot be written" in "".join(said), 120,
               "the run to say that results cannot be written")
    return thread, box, said


def test_a_full_disk_pauses_new_rollouts_and_the_run_goes_on_once_space_is_freed(tiny, rows, dask_client, capfd,
                                                                                  monkeypatch):
    monkeypatch.setattr(dispatch, "WRITE_RETRY_S", 0.5)
    endpoint, out = Endpoint(), tiny / "out"
    with ScriptedLLM(endpoint) as server:
        thread, box, said = _run_until_the_disk_is_full(tiny, rows, server, endpoint, capfd, client=dask_client,
                                                        write_retry_timeout=600)
        endpoint.release()  # the rollouts that had started go on; no other may start
        poll_until(endpoint.idle, 60, "the rollouts in flight to finish")
        started_while_full = endpoint.started
        assert started_while_full < TASKS * N
        # a free slot would start the next rollout at once; while the writes fail (retried every 0.5 s) none starts
        assert stays(lambda: endpoint.started == started_while_full, 4), "a rollout started while results could not be written"
        free(tiny)
        thread.join(180)
    assert not thread.is_alive() and "error" not in box, box.get("error")
    said.append(capfd.readouterr().err)
    results = box["outcome"].results
    assert len(results) == TASKS * N and not results.duplicated(["instance_id", "rollout"]).any()
    assert (results.exit_reason == "submitted").all()
    assert _on_disk(out) == TASKS * N
    assert endpoint.started == TASKS * N  # nothing ran twice
    text = "".join(said)
    assert "finished rollouts wait in memory" in text and "written again" in text, text[-3000:]


def test_a_disk_that_stays_full_ends_the_run_with_a_spill_the_next_run_writes(tiny, rows, dask_client, capfd,
                                                                             monkeypatch):
    monkeypatch.setattr(dispatch, "WRITE_RETRY_S", 0.5)
    endpoint, out = Endpoint(), tiny / "out"
    with ScriptedLLM(endpoint) as server:
        thread, box, said = _run_until_the_disk_is_full(tiny, rows, server, endpoint, capfd, client=dask_client,
                                                        write_retry_timeout=3)
        endpoint.release()
        thread.join(180)
        assert not thread.is_alive()
        error = box.get("error")
        assert isinstance(error, ResultsNotWritten), box
        written = _on_disk(out)
        spilled = spilled_files(out)
        waiting = sum(len(pd.read_parquet(f)) for f in spilled)
        finished = endpoint.started  # every rollout that started finished (none is left in flight)
        assert waiting >= 1 and written + waiting == finished < TASKS * N
        message = str(error)
        assert f"{waiting} finished rollouts" in message and str(spilled[0].parent) in message, message
        assert f"{TASKS * N - finished} rollouts did not start" in message and "No space left" in message, message

        free(tiny)
        before = Counter(calls=endpoint.calls)
        endpoint.release()
        again = run(rows[:TASKS], _agents(), client=dask_client, engine="external", base_url=server.base_url,
                    model_name="scripted", n=N, output_dir=str(out), progress=False, verify=False, flush_every=1)
    results = again.results
    assert len(results) == TASKS * N and not results.duplicated(["instance_id", "rollout"]).any()
    assert _on_disk(out) == TASKS * N and not spilled_files(out)  # the spill moved into results/
    assert endpoint.calls - before["calls"] == 2 * (TASKS * N - finished)  # only the rollouts that never started ran
