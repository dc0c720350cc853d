"""`--base-url URL1,URL2`: replicas of one external model. A real run (multi-process LocalCluster, bubblewrap
sandboxes, Parquet) spreads its rollouts over two real HTTP endpoints, each rollout staying on one; a replica that
serves another model is refused before anything runs, naming it."""

from __future__ import annotations

import asyncio

import pandas as pd
import pytest

from conftest import AGENT_CONFIG, assistant_turns
from uni_agent import run
from uni_agent.engines.external import external_engines, replica_urls
from uni_agent.llm import LLMError
from uni_agent.settings import RunSettings
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message


def submit_after_one_look(body):
    return tool_call_message("execute_bash", {"command": "ls"}) if assistant_turns(body) == 0 else \
        tool_call_message("submit", {})


def test_replica_urls_are_split_and_trimmed():
    assert replica_urls(" http://a:1/v1/ ,http://b:2/v1,, ") == ["http://a:1/v1", "http://b:2/v1"]


def test_a_run_spreads_its_rollouts_over_the_replicas(dask_client, rows, tmp_path):
    with ScriptedLLM(submit_after_one_look) as first, ScriptedLLM(submit_after_one_look) as second:
        run(rows[:4], str(AGENT_CONFIG), client=dask_client, engine="external",
            base_url=f"{first.base_url},{second.base_url}", model_name="scripted", agent_workers=1, n=2,
            verify=False, output_dir=str(tmp_path / "out"), progress=False)
        counts = (first.num_requests, second.num_requests)
    results = pd.read_parquet(tmp_path / "out" / "results")
    assert len(results) == 8 and (results.exit_reason == "submitted").all(), results[["exit_reason", "error"]]
    # 8 rollouts of 2 calls each; the least-loaded replica gets each new rollout, so both got a share
    assert sum(counts) == 16 and min(counts) >= 4, counts


def test_a_replica_serving_another_model_is_refused():
    with ScriptedLLM(submit_after_one_look) as first, ScriptedLLM(submit_after_one_look, model="other") as second:
        settings = RunSettings(engine="external", base_url=f"{first.base_url},{second.base_url}")
        with pytest.raises(LLMError, match=f"{second.base_url} does not serve 'scripted'"):
            asyncio.run(external_engines(None, settings, ""))
