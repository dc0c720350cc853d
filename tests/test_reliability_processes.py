"""Reliability under process loss, on real processes: a driver killed with -9 and resumed; a `dask worker` killed
with -9 in the middle of a run, with and without a nanny that restarts it; every worker lost, with a worker coming
back and without. Nothing may be lost or recorded twice, and nothing may be left behind.

The model is a ScriptedLLM (a real OpenAI-compatible HTTP server, see uni_agent/testing/scripted_llm.py) with a
delay per reply, so that the kills land while rollouts are in flight; it counts the requests it gets, which shows
what a resumed run re-did.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml
from distributed import Client

from conftest import AGENT_CONFIG, REPO_ROOT, SANDBOX_PROCESSES, _cmd, poll_until
from uni_agent import AgentConfigs, run
from uni_agent.driver.dataset import read_rows
from uni_agent.driver.run import AgentWorkersLost
from uni_agent.sandbox.local import reap_orphaned_sandboxes, sandbox_root
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
    processes = [cmd for cmd in map(_cmd, Path("/proc").glob("[0-9]*"))
                 if cmd.startswith(SANDBOX_PROCESSES) and str(root) in cmd]
    return dirs + processes


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
         "--output-dir", str(out), "--n", "2", "--agent-workers", "2", "--local-workers", "1", "--no-verify",
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
            # The driver process alone: its LocalCluster's worker processes are orphaned and must end by themselves
            # (they watch their parent), taking their sandboxes' processes with them.
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(30)
            poll_until(lambda: not _group_alive(proc.pid), 60, "the orphaned LocalCluster processes to end")
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


class DaskProcesses:
    """A real `dask scheduler` and `dask worker` processes, started and stopped by the test."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.scheduler_file = tmp_path / "scheduler.json"
        self.env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list = []

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.logs.append(log)
        self.procs[name] = subprocess.Popen([DASK, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return self.procs[name]

    def start_scheduler(self) -> None:
        self._start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                    "--scheduler-file", str(self.scheduler_file))
        poll_until(self.scheduler_file.exists, 60, "the scheduler file")

    def start_worker(self, name: str, nanny: bool = False) -> subprocess.Popen:
        """With `nanny=False` a kill -9 of the process is the whole worker; with a nanny, the nanny restarts it."""
        return self._start(name, "worker", "--scheduler-file", str(self.scheduler_file), "--host", "127.0.0.1",
                           "--no-dashboard", "--nanny" if nanny else "--no-nanny", "--name", name, "--nthreads", "2",
                           "--resources", "SANDBOX=8")

    def kill(self, *names: str) -> None:
        """kill -9, then reap: the pid is gone, so the worker's sandbox dirs count as orphaned."""
        for name in names:
            self.procs[name].kill()
            self.procs[name].wait(30)

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for log in self.logs:
            log.close()


@pytest.fixture
def dask_processes(tmp_path):
    processes = DaskProcesses(tmp_path)
    try:
        processes.start_scheduler()
        yield processes
    finally:
        processes.stop()


@pytest.fixture(params=[False, True], ids=["no-nanny", "nanny"])
def two_workers(request, dask_processes):
    """Two workers; the first one is the victim. With a nanny, the victim comes back under a new address."""
    for i in range(2):
        dask_processes.start_worker(f"w{i}", nanny=request.param)
    with Client(scheduler_file=str(dask_processes.scheduler_file)) as client:
        client.wait_for_workers(2, timeout=60)
        yield client, dask_processes, request.param


def _kill_and_wait(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    poll_until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in _state(pid), 30, f"pid {pid} to die")


def _state(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}") / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def _killing_every_worker(processes: DaskProcesses, at_request: int, then=lambda: None):
    """A look_then_submit policy that, at its `at_request`-th request, kills -9 both workers and then calls `then`;
    also returns a dict that says whether and when it did."""
    killed: dict[str, int] = {}
    requests = 0

    def policy(body):
        nonlocal requests
        requests += 1
        if requests >= at_request and not killed:
            killed["at"] = requests
            processes.kill("w0", "w1")
            then()
        return look_then_submit(body)

    return policy, killed


def _scripted_agents(concurrency: int) -> AgentConfigs:
    return AgentConfigs.load(AGENT_CONFIG).override_all(
        {"concurrency": concurrency, "interaction": {"tools_in": "api", "constrain_tool_calls": False}})


def _run_scripted(data: Path, concurrency: int, client: Client, server: ScriptedLLM, out: Path,
                  **settings: Any) -> Any:
    """One rollout per row against the scripted endpoint, flushed after every result, on the given cluster."""
    return run(str(data), _scripted_agents(concurrency), client=client, engine="external", base_url=server.base_url,
               model_name="scripted", n=1, output_dir=str(out), progress=False, flush_every=1, **settings)


def _assert_each_once(results: pd.DataFrame, expected: set) -> None:
    keys = list(zip(results.instance_id, results.rollout.astype(int)))
    assert len(keys) == len(set(keys)), "a rollout was recorded twice"
    assert set(keys) == expected, f"lost: {expected - set(keys)}"
    bad = results[results.exit_reason != "submitted"]  # records in full: a DataFrame's repr cuts the error text
    assert bad.empty, bad[["instance_id", "rollout", "worker", "exit_reason", "error"]].to_dict("records")


def test_worker_killed_mid_run_loses_no_rollout(tmp_path, data, two_workers):
    client, processes, nanny = two_workers
    rows = read_rows(data)
    n = 2
    expected = {(r["instance_id"], k) for r in rows for k in range(n)}
    root = sandbox_root()
    before = set(root.iterdir())
    victim_address, victim_pid = next((a, pid) for a, pid in client.run(os.getpid).items() if "w0" in
                                      client.scheduler_info()["workers"][a]["name"])
    killed = {}

    def killer_policy(body):
        # Once a few rollouts are underway, kill -9 the worker process of w0 (from the server thread, while it
        # has rollouts in flight), then answer as usual.
        reply = look_then_submit(body)
        if len(server.requests) >= 6 and not killed:
            killed["at"] = len(server.requests)
            if nanny:  # the nanny reaps it and starts a new one
                _kill_and_wait(victim_pid)
            else:
                processes.kill("w0")
        return reply

    with ScriptedLLM(killer_policy, delay_s=0.5) as server:
        outcome = run(str(data), _scripted_agents(4), client=client, engine="external", base_url=server.base_url,
                      model_name="scripted", agent_workers=2, n=n, output_dir=str(tmp_path / "out"), progress=False,
                      flush_every=1)
    assert killed, "the worker was never killed"
    # Rollouts that were in flight on the killed worker had already asked the model: their requests were made
    # twice (once lost with the worker, once on another).
    assert len(server.requests) > len(expected) * REQUESTS_PER_ROLLOUT, len(server.requests)
    results = _results(tmp_path / "out")
    _assert_each_once(results, expected)  # the lost rollouts ran again and finished normally
    assert len(outcome.results) == len(expected)
    assert set(results.worker) - {victim_address}, results.worker.tolist()
    if nanny:  # the nanny brought the worker back, under a new address
        poll_until(lambda: any("w0" in w["name"] and a != victim_address
                               for a, w in client.scheduler_info()["workers"].items()), 60, "w0 to be restarted")
    poll_until(lambda: not _sandbox_leftovers(root, before), 30, "no sandbox dirs or bwrap processes left")


def test_every_worker_lost_then_one_joins_the_run_completes(tmp_path, data, dask_processes):
    """Both workers die mid-run; a new one joins (a requeued SLURM job, say): new agent workers start on it and
    the run completes with every rollout exactly once."""
    for i in range(2):
        dask_processes.start_worker(f"w{i}")
    expected = {(r["instance_id"], 0) for r in read_rows(data)}
    root = sandbox_root()
    before = set(root.iterdir())
    killer_policy, killed = _killing_every_worker(dask_processes, 6, then=lambda: dask_processes.start_worker("w2"))

    with Client(scheduler_file=str(dask_processes.scheduler_file)) as client:
        client.wait_for_workers(2, timeout=60)
        with ScriptedLLM(killer_policy, delay_s=0.5) as server:
            _run_scripted(data, 4, client, server, tmp_path / "out", agent_workers=2, worker_wait_timeout=120)
        w2 = next(a for a, w in client.scheduler_info()["workers"].items() if w["name"] == "w2")
    assert killed, "the workers were never killed"
    results = _results(tmp_path / "out")
    _assert_each_once(results, expected)
    assert w2 in set(results.worker), "no rollout ran on the worker that joined"
    # A worker killed with -9 leaves its sandbox dirs; the next sandbox start on the host removes those whose owner is
    # dead. When the kill came after the last start, none follows: remove them as that start would. (A dir of the
    # live worker w2 is not removed by this, so a leak there still fails.)
    reap_orphaned_sandboxes(root)
    poll_until(lambda: not _sandbox_leftovers(root, before), 30, "no sandbox dirs or bwrap processes left")


def test_every_worker_lost_for_good_is_a_clear_error_and_a_rerun_finishes(tmp_path, data, dask_processes):
    """Both workers die and none comes back within worker_wait_timeout: the run stops with an error that says
    what to do, the finished rollouts are on disk, the unfinished ones are not recorded (no `error` rows that a
    rerun would skip), and a rerun on a new worker runs exactly the missing ones."""
    for i in range(2):
        dask_processes.start_worker(f"w{i}")
    expected = {(r["instance_id"], 0) for r in read_rows(data)}
    out = tmp_path / "out"
    killer_policy, killed = _killing_every_worker(dask_processes, 10)

    with Client(scheduler_file=str(dask_processes.scheduler_file)) as client:
        client.wait_for_workers(2, timeout=60)
        with ScriptedLLM(killer_policy, delay_s=0.5) as server:
            with pytest.raises(AgentWorkersLost, match="rerun with the same output dir") as lost:
                _run_scripted(data, 4, client, server, out, agent_workers=2, worker_wait_timeout=3)
            first = _results(out)
            done = set(zip(first.instance_id, first.rollout.astype(int)))
            assert len(done) == len(first) and 0 < len(first) < len(expected), len(first)
            assert (first.exit_reason == "submitted").all(), first[["instance_id", "error"]]
            assert f"{len(expected) - len(first)} of {len(expected)} rollouts did not finish" in str(lost.value)

            dask_processes.start_worker("w2")
            client.wait_for_workers(1, timeout=60)
            before_rerun = len(server.requests)
            _run_scripted(data, 4, client, server, out, agent_workers=2)
            assert len(server.requests) - before_rerun == (len(expected) - len(done)) * REQUESTS_PER_ROLLOUT
    _assert_each_once(_results(out), expected)


def test_a_rollout_whose_worker_is_lost_three_times_in_a_row_still_finishes(tmp_path, data, dask_processes):
    """One rollout, one worker at a time: at the rollout's first model call the worker running it is killed -9 and a
    new one joins, three times over. Each loss is the infrastructure's, not the rollout's: it must run a fourth time
    and finish, not be recorded as an `error` row that a rerun would skip (every worker lost at once, on a busy
    machine, spent a rollout's attempts the same way, one failed call per dead actor it was sent to)."""
    one = tmp_path / "one.parquet"
    pd.read_parquet(data).head(1).to_parquet(one)
    expected = {(r["instance_id"], 0) for r in read_rows(one)}
    dask_processes.start_worker("w0")
    losses = 3
    killed: list[str] = []

    def policy(body):
        first_call = not any(m["role"] == "assistant" for m in body["messages"])
        if first_call and len(killed) < losses:
            victim = f"w{len(killed)}"
            dask_processes.kill(victim)
            killed.append(victim)
            dask_processes.start_worker(f"w{len(killed)}")
        return look_then_submit(body)

    with Client(scheduler_file=str(dask_processes.scheduler_file)) as client:
        client.wait_for_workers(1, timeout=60)
        with ScriptedLLM(policy, delay_s=0.2) as server:
            _run_scripted(one, 1, client, server, tmp_path / "out", agent_workers=1, worker_wait_timeout=120)
    _assert_each_once(_results(tmp_path / "out"), expected)
    assert killed == ["w0", "w1", "w2"]
