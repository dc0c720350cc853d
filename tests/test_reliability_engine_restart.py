"""The engine dies under a run: the real llama-server (a subprocess of its Dask actor) killed with -9 while rollouts
are in flight. Killed once, it is restarted on the same port, the model calls that met it down wait for it, and every
rollout finishes, none as infra, with its conversation and token chain intact. Killed again at every restart, the
run ends with a clear error once the restart budget is spent, and nothing is left behind. A restart asked for (new
weights) keeps the port, and a model that does not start leaves the old one serving. A model call waits for a down
endpoint, bounded. Real processes throughout: llama-server with SmolLM2 (skipped, saying so, without the build), a
LocalCluster, bubblewrap sandboxes; the down-wait test uses a ScriptedLLM (a real HTTP server) answering 503.
"""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import pytest

from conftest import AGENT_CONFIG, REPO_ROOT
from uni_agent import run
from uni_agent.engines.llama_build import find_binary
from uni_agent.engines.llama_cpp import LlamaServer, default_model_path
from uni_agent.engines.server import EngineRestartError
from uni_agent.llm import ChatClient, EndpointDownError
from uni_agent.testing.llama_watch import answered, engine_port, server_pids
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM

needs_server = pytest.mark.skipif(find_binary("cpu") is None, reason="no llama-server build: run examples/setup.sh")
PARALLEL_INFER = REPO_ROOT / "examples" / "agent_interaction" / "parallel_infer.py"


def test_a_model_call_waits_for_a_down_endpoint_then_fails_as_down():
    """A server that answers 503 while it loads (llama-server after a restart) is waited for, past max_attempts; a
    port nobody listens on is polled for `down_wait` seconds, then the call fails naming the wait."""
    loading_until = time.monotonic() + 3

    def policy(body):
        if time.monotonic() < loading_until:
            return Fault(503, '{"error": {"message": "Loading model", "code": 503}}')
        return {"role": "assistant", "content": "back"}

    async def scenario(url_up, url_down):
        up = ChatClient(url_up, "m", max_attempts=2, down_wait=30)
        reply = await up.chat([{"role": "user", "content": "hi"}])
        down = ChatClient(url_down, "m", max_attempts=2, down_wait=2)
        started = time.monotonic()
        with pytest.raises(EndpointDownError, match=r"still down after waiting \d+ s") as info:
            await down.chat([{"role": "user", "content": "hi"}])
        for client in (up, down):
            await client.aclose()
        return reply, time.monotonic() - started, info.value

    with ScriptedLLM(lambda body: {"role": "assistant", "content": "x"}) as gone:
        url_down = gone.base_url  # bound, then closed: nothing listens there
    with ScriptedLLM(policy) as server:
        reply, waited, error = asyncio.run(scenario(server.base_url, url_down))
        polls = len(server.requests)
    assert reply.content == "back" and polls > 2  # more polls than max_attempts, then the answer
    assert 2 <= waited < 10 and "cannot connect" in str(error)


class Killer(threading.Thread):
    """Kills the run's llama-server with -9 once it has answered `after` calls; with `every_start`, again each time
    it comes back."""

    def __init__(self, log: Path, after: int, every_start: bool = False):
        super().__init__(daemon=True)
        self.log, self.after, self.every_start = log, after, every_start
        self.kills: list[tuple[float, int]] = []  # (time, answered calls at the kill)
        self.port: int | None = None
        self.stop = threading.Event()

    def run(self):
        killed: set[int] = set()
        while not self.stop.wait(0.05):
            self.port = self.port or engine_port(self.log)
            if self.port is None or answered(self.log) < self.after:
                continue
            for pid in set(server_pids(self.port)) - killed:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
                self.kills.append((time.monotonic(), answered(self.log)))
                if not self.every_start:
                    return


def _events(logs: Path, name: str) -> list[dict]:
    return [e for f in logs.glob("*.jsonl") for line in f.read_text().splitlines()
            if (e := json.loads(line)).get("event") == name]


@pytest.mark.llm
@needs_server
def test_engine_killed_mid_run_restarts_and_every_rollout_finishes(tmp_path, dask_client):
    out = tmp_path / "out"
    killer = Killer(out / "logs" / "engine-0.log", after=2)
    killer.start()
    started = time.monotonic()
    try:
        outcome = run(None, AGENT_CONFIG, client=dask_client, n=2, max_samples=2, max_turns=3, max_tokens=64,
                      output_dir=str(out), progress=False)
    finally:
        killer.stop.set()
    ended = time.monotonic()
    assert len(killer.kills) == 1, "the engine was never killed (it answered too few calls?)"
    killed_at, answered_before = killer.kills[0]
    assert started < killed_at < ended

    results = outcome.results
    assert len(results) == 4 and set(results.rollout) == {0, 1}
    assert (results.failure_kind != "infra").all(), results[["failure_kind", "failure_cause"]].to_dict("records")
    assert results.error.isna().all(), results.error.tolist()
    # calls were answered after the restart: the rollouts went on with the restarted server
    assert answered(out / "logs" / "engine-0.log") > answered_before
    # conversations intact: every turn's prompt continued the rollout's token sequence (token-in from exact ids)
    assert (results.token_source == "llama_server").all()
    assert results.token_drift.isna().all(), results.token_drift.tolist()
    assert results.tokens_missing.isna().all(), results.tokens_missing.tolist()
    assert all(len(ids) > 0 for ids in results.input_ids)

    log = (out / "logs" / "engine-0.log").read_text(errors="replace")
    assert "[uni-agent] exit code -9: restart 1" in log
    assert log.count(f"listening on http://127.0.0.1:{killer.port}") == 2  # the same port, twice
    [crash] = _events(out / "logs", "engine_crashed")[:1]
    assert crash["returncode"] == -9 and "log_tail" in crash
    [restarted] = [e for e in _events(out / "logs", "engine_restarted") if "down_s" in e][:1]
    assert 0 < restarted["down_s"] < 60
    assert not server_pids(killer.port), "the engine outlived the run"


@pytest.mark.llm
@needs_server
def test_engine_killed_at_every_start_ends_the_run_with_a_clear_error(tmp_path):
    """A driver process (the CLI with its own LocalCluster) whose engine is killed at every start: after
    engine_max_restarts restarts the run ends, exit 1, naming the engine, the budget and the exit code, within a
    bounded time; the unfinished rollouts are not recorded as failures (a rerun runs them), nothing is left behind,
    and shutdown prints no traceback."""
    out = tmp_path / "out"
    killer = Killer(out / "logs" / "engine-0.log", after=1, every_start=True)
    killer.start()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "UNI_AGENT_ENGINE_MAX_RESTARTS": "2",
           "UNI_AGENT_ENGINE_DOWN_WAIT": "600"}  # not the down-wait: the restart budget must end the run
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, str(PARALLEL_INFER), "--agent-config-path", str(AGENT_CONFIG), "--n", "2",
             "--max-samples", "2", "--num-workers", "2", "--max-turns", "3", "--max-tokens", "64",
             "--output-dir", str(out), "--no-progress"],
            env=env, capture_output=True, text=True, timeout=540)
    finally:
        killer.stop.set()
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert len(killer.kills) == 3  # the first start and both restarts
    error = proc.stderr.strip().splitlines()
    final = next(line for line in reversed(error) if line.startswith("error:"))
    assert "EngineFailed: every engine replica is down for good" in final, proc.stderr[-3000:]
    assert "engine_max_restarts=2" in proc.stderr and "last exit code -9" in proc.stderr
    assert "Traceback" not in proc.stderr and "Event loop is closed" not in proc.stderr, proc.stderr[-5000:]
    assert took - (killer.kills[-1][0] - started) < 60, "the run took long to end after the last kill"
    files = sorted((out / "results").glob("part-*.parquet"))
    recorded = pd.concat([pd.read_parquet(f) for f in files]) if files else pd.DataFrame({"failure_kind": []})
    assert (recorded.failure_kind != "infra").all()  # finished ones only; the rest are left for a rerun
    assert not server_pids(killer.port), "the engine outlived the run"


@pytest.mark.llm
@needs_server
def test_a_requested_restart_keeps_the_port_and_a_model_that_does_not_start_leaves_the_old_one(tmp_path):
    """ServerActor.restart, the rolling restart's step (new weights on the same port): a good model serves at the same
    URL; a model that does not start is refused, with preflight before the serving server was touched, without it
    after the old model was brought back; a crash after a requested restart is restarted as before."""
    good = default_model_path()
    copy, bad = tmp_path / "copy.gguf", tmp_path / "bad.gguf"
    shutil.copy(good, copy)
    bad.write_bytes(b"GGUF" + b"\0" * 1000)  # a GGUF header and nothing a server can load

    async def models(url):
        async with httpx.AsyncClient() as http:
            return (await http.get(f"{url}/models")).json()["data"][0]["id"]

    async def scenario():
        server = LlamaServer(good, "smol", variant="cpu", slots=2, context_length=1024, threads=1,
                             log_path=str(tmp_path / "engine.log"))
        try:
            url = await server.start(120)
            assert await server.restart(str(copy), drain_timeout=5) == url and server.model_path == str(copy)
            assert await models(url) == "smol"
            for preflight in (True, False):
                before = (await server.describe())["pid"]
                with pytest.raises(EngineRestartError, match="serves" if preflight else "serves again") as info:
                    await server.restart(str(bad), preflight=preflight)
                assert str(copy) in str(info.value) and server.model_path == str(copy)
                after = await server.describe()
                assert after["state"] == "serving" and (after["pid"] == before) == preflight
                assert await models(url) == "smol"
            os.kill((await server.describe())["pid"], signal.SIGKILL)
            deadline = time.monotonic() + 60
            while (d := await server.describe())["restarts"] < 1 or d["state"] != "serving":
                assert time.monotonic() < deadline, d
                await asyncio.sleep(0.1)
            assert d["url"] == url
        finally:
            await server.stop()
        assert not await server.alive()

    asyncio.run(scenario())
