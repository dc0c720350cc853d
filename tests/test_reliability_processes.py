"""Reliability under process loss, on real processes: a driver killed with -9 and resumed, and a `dask worker`
killed with -9 in the middle of a run. Nothing may be lost or recorded twice, and nothing may be left behind.

The model is a ScriptedLLM (a real OpenAI-compatible HTTP server, see uni_agent/testing/scripted_llm.py) with a
delay per reply, so that the kills land while rollouts are in flight; it counts the requests it gets, which shows
what a resumed run re-did.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from distributed import Client

from conftest import AGENT_CONFIG, REPO_ROOT, _cmd, poll_until
from uni_agent import AgentConfigs, run
from uni_agent.dataset import read_rows
from uni_agent.sandbox.local import sandbox_root
from uni_agent.tasks.swe_form import convert
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

DASK = str(Path(sys.executable).parent / "dask")
PARALLEL_INFER = REPO_ROOT / "examples" / "agent_interaction" / "parallel_infer.py"
SECRET = "planted-key-7f3c9a1e5d"  # matches no token pattern: only the registered-secret redaction can catch it



def look_then_submit(body):
    """Two turns per rollout: one command, then submit."""
    if sum(m["role"] == "assistant" for m in body["messages"]) == 0:
        return tool_call_message("execute_bash", {"command": "git status --short | head -3"})
    return tool_call_message("submit", {})


REQUESTS_PER_ROLLOUT = 2


def _sandbox_leftovers(root: Path, before: set[Path]) -> list[str]:
    dirs = [str(p) for p in set(root.iterdir()) - before]
    bwraps = [_cmd(p) for p in Path("/proc").iterdir() if p.name.isdigit() and _cmd(p).startswith("bwrap")
              and str(root) in _cmd(p)]
    return dirs + bwraps


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "bundled.parquet"
    convert(None, path)
    return path


def _agent_yaml(tmp_path: Path, concurrency: int) -> Path:
    agents = yaml.safe_load(AGENT_CONFIG.read_text())
    for agent in agents:
        agent["concurrency"] = concurrency
        agent["interaction"].update(tools_in="api", constrain_tool_calls=False)
    path = tmp_path / "agents.yaml"
    path.write_text(yaml.safe_dump(agents))
    return path


def _results(out: Path) -> pd.DataFrame:
    files = sorted((out / "results").glob("part-*.parquet"))
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True) if files else pd.DataFrame()


def _start_driver(tmp_path: Path, data: Path, server: ScriptedLLM, out: Path, name: str) -> tuple:
    env = {**os.environ, "UNI_AGENT_FLUSH_EVERY": "1", "UNI_AGENT_API_KEY": SECRET, "PYTHONPATH": str(REPO_ROOT)}
    stdout, stderr = open(tmp_path / f"{name}.out", "wb"), open(tmp_path / f"{name}.err", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, str(PARALLEL_INFER), "--engine", "external", "--base-url", server.base_url,
         "--model", "scripted", "--data-path", str(data), "--agent-config-path", str(_agent_yaml(tmp_path, 2)),
         "--output-dir", str(out), "--n", "2", "--num-workers", "2", "--n-workers", "1", "--no-verify",
         "--no-progress"],
        env=env, stdout=stdout, stderr=stderr, start_new_session=True)  # its own group: its LocalCluster with it
    return proc, stdout, stderr


def _group_alive(pgid: int) -> bool:
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                fields = (p / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                return True
    return False


def test_driver_killed_mid_run_resumes_only_missing_rollouts(tmp_path, data):
    rows = read_rows(data)
    expected = {(r["instance_id"], k) for r in rows for k in range(2)}
    out = tmp_path / "out"
    root = sandbox_root()
    before = set(root.iterdir())

    with ScriptedLLM(look_then_submit, delay_s=1.0) as server:
        proc, *files = _start_driver(tmp_path, data, server, out, "first")
        try:
            # Kill -9 once some results are on disk and more rollouts are in flight (concurrency 2, 2 s each).
            poll_until(lambda: len(list((out / "results").glob("part-*.parquet"))) >= 2 or proc.poll() is not None,
                  180, "the first results to be flushed")
            assert proc.poll() is None, (tmp_path / "first.err").read_text()[-3000:]
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            poll_until(lambda: not _group_alive(proc.pid), 60, "the driver's LocalCluster processes to die")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            for f in files:
                f.close()
        first = _results(out)
        done_before = set(zip(first.instance_id, first.rollout.astype(int)))
        assert 2 <= len(first) < len(expected), "the kill did not land mid-run"
        assert len(done_before) == len(first)  # no duplicates even in a crashed run's partial results
        first_requests = len(server.requests)
        assert first_requests < len(expected) * REQUESTS_PER_ROLLOUT

        proc, *files = _start_driver(tmp_path, data, server, out, "second")
        try:
            assert proc.wait(300) == 0, (tmp_path / "second.err").read_text()[-3000:]
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            for f in files:
                f.close()
        rerun_requests = len(server.requests) - first_requests

    missing = expected - done_before
    # Only the missing rollouts ran again: each makes exactly REQUESTS_PER_ROLLOUT requests.
    assert rerun_requests == len(missing) * REQUESTS_PER_ROLLOUT, (rerun_requests, len(missing))
    assert f"{len(done_before)} already done" in (tmp_path / "second.err").read_text()
    final = _results(out)
    keys = list(zip(final.instance_id, final.rollout.astype(int)))
    assert len(keys) == len(set(keys)) == len(expected) and set(keys) == expected
    assert (final.exit_reason == "submitted").all(), final[["instance_id", "rollout", "error"]]
    # The killed driver's sandboxes were reaped by the rerun's workers (their owner pid was gone).
    poll_until(lambda: not _sandbox_leftovers(root, before), 30, "no sandbox dirs or bwrap processes left")
    # The API key the driver was given appears in none of its outputs.
    outputs = [p for p in out.rglob("*") if p.is_file()] + sorted(tmp_path.glob("*.out")) + sorted(
        tmp_path.glob("*.err"))
    assert any(p.name == "summary.json" for p in outputs) and any("logs" in p.parts for p in outputs)
    leaked = [str(p) for p in outputs if p.suffix != ".parquet" and SECRET.encode() in p.read_bytes()]
    assert SECRET not in final.astype(str).to_csv()  # Parquet is compressed: searched decoded
    assert not leaked, f"the API key leaked into {leaked}"


@pytest.fixture
def two_workers(tmp_path):
    """A real `dask scheduler` and two `dask worker --no-nanny` processes (so a kill -9 is the whole worker)."""
    scheduler_file = tmp_path / "scheduler.json"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    logs = []
    procs: dict[str, subprocess.Popen] = {}

    def start(name, *args):
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        procs[name] = subprocess.Popen([DASK, *args], env=env, stdout=log, stderr=subprocess.STDOUT)

    try:
        start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
              "--scheduler-file", str(scheduler_file))
        poll_until(scheduler_file.exists, 60, "the scheduler file")
        for i in range(2):
            start(f"worker-{i}", "worker", "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1",
                  "--no-dashboard", "--no-nanny", "--name", f"w{i}", "--nthreads", "2", "--resources", "SANDBOX=8")
        with Client(scheduler_file=str(scheduler_file)) as client:
            client.wait_for_workers(2, timeout=60)
            yield client, procs
    finally:
        for proc in reversed(list(procs.values())):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for log in logs:
            log.close()


def test_worker_killed_mid_run_loses_no_rollout(tmp_path, data, two_workers):
    client, procs = two_workers
    rows = read_rows(data)
    n = 2
    expected = {(r["instance_id"], k) for r in rows for k in range(n)}
    root = sandbox_root()
    before = set(root.iterdir())
    pids = client.run(os.getpid)
    victim_address = next(a for a, pid in pids.items() if pid == procs["worker-0"].pid)
    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"concurrency": 4, "interaction": {"tools_in": "api", "constrain_tool_calls": False}})

    killed = {}

    def killer_policy(body):
        # Once a few rollouts are underway, kill -9 the worker holding agent-worker actor 0 (from the server
        # thread, while that worker has rollouts in flight), then answer as usual.
        reply = look_then_submit(body)
        if len(server.requests) >= 6 and not killed:
            killed["at"] = len(server.requests)
            procs["worker-0"].kill()
            procs["worker-0"].wait(30)  # reaped: its pid is gone, so its sandbox dirs count as orphaned
        return reply

    with ScriptedLLM(killer_policy, delay_s=0.5) as server:
        outcome = run(str(data), agents, client=client, engine="external", base_url=server.base_url,
                      model_name="scripted", num_workers=2, n=n, output_dir=str(tmp_path / "out"), progress=False,
                      flush_every=1)
    assert killed, "the worker was never killed"
    # Rollouts that were in flight on the killed worker had already asked the model: their requests were made
    # twice (once lost with the worker, once on the survivor).
    assert len(server.requests) > len(expected) * REQUESTS_PER_ROLLOUT, len(server.requests)
    results = _results(tmp_path / "out")
    keys = list(zip(results.instance_id, results.rollout.astype(int)))
    assert len(keys) == len(set(keys)), "a rollout was recorded twice"
    assert set(keys) == expected, f"lost: {expected - set(keys)}"
    assert len(outcome.results) == len(expected)
    # The lost rollouts ran again on the surviving worker and finished normally.
    assert (results.exit_reason == "submitted").all(), results[["instance_id", "rollout", "worker", "error"]]
    survivors = set(results.worker) - {victim_address}
    assert survivors, results.worker.tolist()
    poll_until(lambda: not _sandbox_leftovers(root, before), 30, "no sandbox dirs or bwrap processes left")
