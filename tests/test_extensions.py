"""Extensions from outside the package reach the worker processes: a tool, a grader and a sandbox backend named in
the config by import path ("module:Object") run in the agent and verification workers of a real multi-process
LocalCluster, with real bubblewrap sandboxes (the backend is the local one, marked), Parquet results and a
ScriptedLLM endpoint (a real HTTP server whose replies come from a function). The extension lives in
tests/fixtures/extension/ua_extension.py, on the workers' PYTHONPATH; uni_agent never imports it."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from conftest import assistant_turns
from uni_agent import AgentConfigs, ConfigError, run
from uni_agent.config import validate_agent
from uni_agent.private_dirs import dask_dir
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

EXTENSION_DIR = Path(__file__).parent / "fixtures" / "extension"
AGENT = {"name": "ext", "tools": [{"name": "ua_extension:PidTool"}, {"name": "submit"}],
         "interaction": {"tools_in": "api", "max_turns": 4, "constrain_tool_calls": False}}


def _deployment(instance_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "ua_extension:MarkedDeploymentConfig", "repo": f"bundled:{instance_id}", "marker": instance_id,
            **extra}


@pytest.fixture()
def extension_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver and the worker processes started after this can import ua_extension."""
    monkeypatch.syspath_prepend(str(EXTENSION_DIR))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(EXTENSION_DIR), os.environ.get("PYTHONPATH")])))


def note_then_submit(body: dict[str, Any]) -> dict[str, Any]:
    return tool_call_message("note_pid", {}) if assistant_turns(body) == 0 else tool_call_message("submit", {})


def test_a_tool_a_grader_and_a_backend_from_outside_run_in_the_worker_processes(rows, tmp_path, extension_path):
    from distributed import Client, LocalCluster

    chosen = rows[:2]
    data = [{**row, "agent_name": "ext", "extra_info": {**row["extra_info"], "tools_kwargs": {
        "env": {"deployment": _deployment(row["instance_id"])}, "reward": {"name": "ua_extension:PidGrader"}}}}
        for row in chosen]
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0",
                      resources={"SANDBOX": 8}, local_directory=str(dask_dir())) as cluster, Client(cluster) as client, \
            ScriptedLLM(note_then_submit) as server:
        worker_pids = set(client.run(os.getpid).values())
        run(data, AgentConfigs({"ext": AGENT}, "test"), client=client, engine="external", base_url=server.base_url,
            model_name="scripted", agent_workers=2, output_dir=str(tmp_path / "out"), progress=False, n=1)
    results = pd.read_parquet(tmp_path / "out" / "results")
    assert len(results) == 2 and (results.exit_reason == "submitted").all(), results[["exit_reason", "error"]]
    assert (results.reward == 1.0).all(), results.verification.tolist()
    for row in results.itertuples():
        tool_pid = int(re.search(r"tool-pid=(\d+)", row.patch).group(1))
        backend_pid = int(re.search(rf"backend-pid=(\d+) {row.instance_id}", row.patch).group(1))
        grader_pid = int(re.search(r"grader-pid=(\d+)", json.loads(row.verification)["log_tail"]).group(1))
        # each ran in a worker process (none in this driver), the tool in the agent worker that started the sandbox
        assert {tool_pid, backend_pid, grader_pid} <= worker_pids and os.getpid() not in worker_pids
        assert tool_pid == backend_pid


def test_an_extension_backend_keeps_its_config_strict(extension_path):
    """Its own keys validate, a key it lacks is an error naming the field, as for the packaged backends."""
    agent = validate_agent({**AGENT, "env": {"deployment": _deployment("x")}}, "agents.yaml")
    assert type(agent.env.deployment).__name__ == "MarkedDeploymentConfig" and agent.env.deployment.marker == "x"
    with pytest.raises(ConfigError, match=r"env.deployment.markr: Extra inputs are not permitted"):
        validate_agent({**AGENT, "env": {"deployment": _deployment("x", markr="y")}}, "agents.yaml")
    with pytest.raises(ConfigError, match=r"tools.0.name: Value error, cannot import tool 'ua_extension:Nope'"):
        validate_agent({**AGENT, "tools": [{"name": "ua_extension:Nope"}]}, "agents.yaml")
