"""A run's first wave starts its sandboxes while the engines start (uni_agent.driver.session,
`rollouts_before_engines`; uni_agent.episode.worker): the rollouts wait for the engines to act, not to start a sandbox.

The engine here is an external endpoint (a ScriptedLLM: a real HTTP server) behind a start function that holds its
start until the agent workers' logs say the sandboxes started, as a model loading would hold it; the cluster, the
agent workers and the bubblewrap sandboxes are real. Without the overlap no sandbox starts before the engine is
ready, and the held start gives up after HOLD_S."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from conftest import AGENT_CONFIG, assistant_turns
from uni_agent import AgentConfigs, run
from uni_agent.engines.external import external_engines
from uni_agent.llm import LLMError
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

HOLD_S = 40.0
HELD: dict[str, Any] = {}  # what the held start waits for, and what it saw (the start runs in this process)


def _early_starts(log_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(line) for f in log_dir.glob("agent-worker-*.jsonl") for line in f.read_text().splitlines()
             if '"sandbox_started_before_engines"' in line]
    return [e for e in lines if e.get("event") == "sandbox_started_before_engines"]


async def held_engine(client: Any, settings: Any, log_dir: str) -> Any:
    """The ScriptedLLM (settings.base_url), once `HELD["want"]` sandboxes started before it or HOLD_S passed; then
    the endpoint itself, or HELD["fail"] raised (an engine that never came up)."""
    deadline = time.monotonic() + HOLD_S
    while len(started := _early_starts(Path(log_dir))) < HELD["want"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    HELD["started_before_ready"] = len(started)
    if HELD.get("fail"):
        raise LLMError(HELD["fail"])
    return await external_engines(client, settings, log_dir)


def submit_at_once(body: dict[str, Any]) -> dict[str, Any]:
    if assistant_turns(body) == 0:
        return tool_call_message("execute_bash", {"command": "git status --short"})
    return tool_call_message("submit", {})


def _run(rows: list[dict[str, Any]], tmp_path: Path, client: Any, server: ScriptedLLM) -> Any:
    agents = AgentConfigs.load(AGENT_CONFIG).override_all({"interaction": {"tools_in": "api",
                                                                           "constrain_tool_calls": False}})
    return run(rows, agents, client=client, engine=f"{__name__}:held_engine", base_url=server.base_url,
               model_name="scripted", agent_workers=2, output_dir=str(tmp_path / "out"), progress=False, n=1,
               verify=False)


def test_the_first_waves_sandboxes_start_while_the_engine_starts(rows, tmp_path, dask_client):
    HELD.clear()
    HELD["want"] = 4
    with ScriptedLLM(submit_at_once) as server:
        _run(rows[:4], tmp_path, dask_client, server)
        assert len(server.requests) == 8  # no model call before the engine was ready: each rollout's two turns
    assert HELD["started_before_ready"] == 4
    results = pd.read_parquet(tmp_path / "out" / "results")
    assert len(results) == 4 and (results.exit_reason == "submitted").all(), results[["exit_reason", "error"]]
    # the rollouts found their sandboxes started: what they waited of the start is nothing next to the start itself
    starts = {(e["instance_id"], e["rollout"]): e["seconds"] for e in _early_starts(tmp_path / "out" / "logs")}
    for row in results.itertuples():
        assert row.sandbox_start_s < 0.05 < starts[(row.instance_id, row.rollout)], (row.sandbox_start_s, starts)
    # the driver's steps: the agent workers started, then the engine was ready
    phases = [json.loads(line)["phase"] for f in (tmp_path / "out" / "logs").glob("driver-*.jsonl")
              for line in f.read_text().splitlines() if '"run_phase"' in line]
    assert phases.index("agent_workers_started") < phases.index("engines_ready"), phases


def test_an_engine_that_fails_to_start_ends_the_run_and_closes_the_sandboxes_begun(rows, tmp_path, dask_client):
    """The run raises the engine's error; no row is recorded (a rerun runs them) and no sandbox is left (the
    autouse fixture no_leftover_sandboxes checks the dirs, mounts and processes)."""
    HELD.clear()
    HELD.update(want=2, fail="the model did not load")
    with ScriptedLLM(submit_at_once) as server, pytest.raises(LLMError, match="the model did not load"):
        _run(rows[:2], tmp_path, dask_client, server)
    assert HELD["started_before_ready"] == 2
    assert len(server.requests) == 0
    assert not list((tmp_path / "out" / "results").glob("**/*.parquet"))
