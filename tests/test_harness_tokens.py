"""Token truth for programs that bring their own loop, on the real engine: llama-server (the project's build) serving
SmolLM2-135M-Instruct, the program in a real local sandbox (network off) reaching it through the relay and the
gateway, with token capture (llama-server token-in: each call continues the previous call's exact ids).

The row's input_ids/loss_mask/logprobs must line up, the sampled spans must decode to the calls the program got, the
task must be in the prompt ids, and a program that rewrites its history must give a second chain, recorded, never a
silent re-tokenization.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_harness_agent import EXAMPLE, spec
from test_trajectory import _detokenize, _special, llama_server  # noqa: F401 - the real engine, a module fixture

from uni_agent.config import AgentConfig
from uni_agent.episode.rollout import RolloutResult
from uni_agent.episode.envelope import run_episode
from uni_agent.harness import HarnessAgent
from uni_agent.harness.gateway import Gateway
from uni_agent.llm import ChatClient

pytestmark = pytest.mark.llm

# A program that calls three times and rewrites its history before the third call (as a summarising agent does).
CUTTER = r"""
import json, os, urllib.request
def chat(messages):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"messages": messages}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request))["choices"][0]["message"]
task = open(os.environ["UNI_AGENT_PROMPT_FILE"]).read()
messages = [{"role": "system", "content": "Answer in one short sentence."}, {"role": "user", "content": task}]
messages += [chat(messages), {"role": "user", "content": "Say it again, differently."}]
messages += [chat(messages)]
chat([messages[0], {"role": "user", "content": "SUMMARY: the user asked twice. Say goodbye."}])
"""


def agent_config(command: str, mounts: dict[str, str], **interaction: Any) -> AgentConfig:
    return AgentConfig.model_validate({
        "name": "harness", "_target_": "uni_agent.harness.HarnessAgent",
        "interaction": {"max_turns": 3, **interaction},
        "env": {"deployment": {"type": "local", "repo": "bundled:uni-agent__romanum-4"}},
        "harness": {"command": command, "mounts": mounts, "timeout": 600},
    })


def run_on_engine(url: str, agent: AgentConfig, max_tokens: int = 48) -> RolloutResult:
    async def main() -> RolloutResult:
        client = ChatClient(f"{url}/v1", "smol", token_capture="llama_server",
                            sampling={"temperature": 0.8, "max_tokens": max_tokens, "seed": 7})
        gateway = await Gateway().start()
        try:
            return await run_episode(HarnessAgent(agent, gateway=gateway), spec(agent), client)
        finally:
            await gateway.close()
            await client.aclose()

    return asyncio.run(main())


def sampled_spans(result: RolloutResult) -> list[list[int]]:
    ids, mask = np.array(result.input_ids), np.array(result.loss_mask)
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [ids[a:b].tolist() for a, b in zip(edges[::2], edges[1::2])]


def check_aligned(result: RolloutResult) -> None:
    assert result.token_source == "llama_server" and result.tokens_missing is None, result.tokens_missing
    assert len(result.input_ids) == len(result.loss_mask) == len(result.logprobs) > 0
    assert sum(result.loss_mask) == result.completion_tokens  # every sampled token, once, as the engine counted
    logprobs, mask = np.array(result.logprobs), np.array(result.loss_mask)
    assert (logprobs[mask == 0] == 0).all() and (logprobs[mask == 1][~np.isnan(logprobs[mask == 1])] <= 0).all()
    # The policy version per token, as our own loop's rows have it (the online service's staleness bound reads it):
    # the engine's weights (version 0 here) on every sampled token, -1 on the rest.
    versions = np.array(result.token_versions)
    assert len(versions) == len(mask) and (versions[mask == 1] == 0).all() and (versions[mask == 0] == -1).all()
    assert (result.version_min, result.version_max) == (0, 0)


def test_the_example_program_s_calls_are_one_chain_that_decodes_to_its_calls(llama_server: str) -> None:
    """tools_in: prompt with constrained calls (SmolLM2's template ignores `tools`): the model writes hermes JSON
    calls, the program gets them as function calls; the sampled spans decode to exactly those calls."""
    agent = agent_config("python3 /opt/example/agent.py", {"/opt/example": str(EXAMPLE)}, tools_in="prompt",
                         tool_call_parser="hermes", constrain_tool_calls=True)
    max_tokens = 128  # most calls fit; one that does not is cut mid-JSON (below)
    result = run_on_engine(llama_server, agent, max_tokens)
    assert result.num_turns >= 1 and result.exit_reason in ("submitted", "max_turns"), result.error
    check_aligned(result)
    assert result.token_drift is None, result.token_drift  # token-in: every call continued the last one exactly
    chains = result.chains
    assert len(chains) == 1 and chains[0]["token_end"] == len(result.input_ids)
    replies = [m for m in result.messages if m["role"] == "assistant"]
    end = _special(llama_server, "<|im_end|>")
    spans = sampled_spans(result)
    assert len(spans) == result.num_turns == len(replies)
    for span, reply in zip(spans, replies):
        said = _detokenize(llama_server, span[:-1] if span[-1:] == end else span)
        if not reply.get("tool_calls"):
            # Sampled at temperature 0.8, a call can outgrow max_tokens: cut mid-JSON, the program gets it as text
            # (CI met one at 48 tokens; here seeds 5 and 10 did at 48, seed 10 at 128). The span is then the whole
            # budget, and that text.
            assert len(span) == max_tokens and said.strip() == reply["content"].strip(), (len(span), reply)
            continue
        (call,) = reply["tool_calls"]
        said = json.loads(said)
        assert said["name"] == call["function"]["name"]
        assert said["arguments"] == json.loads(call["function"]["arguments"])
    assert any(reply.get("tool_calls") for reply in replies), replies  # at least one call was compared
    first_prompt = result.input_ids[:result.loss_mask.index(1)]
    assert "roman" in _detokenize(llama_server, first_prompt).lower()  # the task is in the prompt ids


def test_a_rewritten_history_starts_a_second_chain_on_the_real_engine(llama_server: str, tmp_path: Path) -> None:
    (tmp_path / "cutter.py").write_text(CUTTER)
    result = run_on_engine(llama_server, agent_config("python3 /opt/prog/cutter.py", {"/opt/prog": str(tmp_path)}))
    assert result.exit_reason == "submitted" and result.num_turns == 3, (result.error, result.harness)
    check_aligned(result)
    chains = result.chains
    assert [(c["first_call"], c["calls"]) for c in chains] == [(1, 2), (3, 1)]
    assert chains[1]["reason"].startswith("history rewritten: message 1 (user)")
    first, second = (result.input_ids[c["token_start"]:c["token_end"]] for c in chains)
    assert chains[0]["token_end"] == chains[1]["token_start"] and chains[1]["token_end"] == len(result.input_ids)
    assert "Say it again" in _detokenize(llama_server, first) and "SUMMARY" not in _detokenize(llama_server, first)
    assert "SUMMARY" in _detokenize(llama_server, second) and "Say it again" not in _detokenize(llama_server, second)
    assert second[0] == first[0]  # the new chain is tokenized from its own start (BOS or the system turn)
    assert result.token_drift is None  # a new chain, not a drift inside one
