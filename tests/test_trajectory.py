"""Token-exact trajectories: the training sequence (uni_agent.episode.trajectory), token capture from the real llama.cpp
server (llama-server with SmolLM2-135M-Instruct), loss masks and their Parquet columns.

The vLLM protocol cannot run here (GPU only): its test answers with a ScriptedLLM (a real HTTP server) that sends the
fields vLLM 0.33 documents for `return_token_ids` / `logprobs` / `return_tokens_as_token_ids`."""

import asyncio
import json
import os
import subprocess
import time

import httpx
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import AGENT_CONFIG, REPO_ROOT
from uni_agent import AgentConfigs, run
from uni_agent.llm import ChatClient, token_capture_for
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message
from uni_agent.episode.trajectory import TurnTokens, build_sequence

SYSTEM = "You are a helpful assistant. Answer in one short sentence."


# -- the sequence, from given turns ------------------------------------------------------------------------------


def test_sequence_appends_only_what_each_prompt_adds_and_masks_sampled_tokens():
    turns = [TurnTokens([1, 2, 3], [10, 11], [-0.5, -0.25]),
             TurnTokens([1, 2, 3, 10, 11, 4, 5], [12], [-1.0]),
             TurnTokens([1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14], [-0.1, -0.2])]
    seq = build_sequence(turns)
    assert seq.input_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14]
    assert seq.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1]
    assert seq.logprobs == [0, 0, 0, -0.5, -0.25, 0, 0, -1.0, 0, -0.1, -0.2]
    assert seq.drift is None


def test_a_prompt_that_does_not_continue_the_sequence_is_drift_and_nothing_after_it_is_trained():
    turns = [TurnTokens([1, 2, 3], [10, 11], [-0.5, -0.25]),
             TurnTokens([1, 2, 3, 10, 99, 4], [12], [-1.0]),  # the sampled 11 came back as 99 (re-tokenized)
             TurnTokens([1, 2, 3, 10, 99, 4, 12, 5], [13], [-0.3])]
    seq = build_sequence(turns)
    assert seq.drift == {"turn": 2, "position": 4, "expected": 11, "got": 99}
    # Cut back to the common prefix, continued exactly as the engine saw call 2; mask 0 from the drift on.
    assert seq.input_ids == [1, 2, 3, 10, 99, 4, 12, 5, 13]
    assert seq.loss_mask == [0, 0, 0, 1, 0, 0, 0, 0, 0]
    assert seq.logprobs == [0, 0, 0, -0.5, 0, 0, -1.0, 0, -0.3]
    assert len(seq.input_ids) == len(seq.loss_mask) == len(seq.logprobs)


def test_turn_tokens_refuse_misaligned_logprobs():
    with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
        TurnTokens([1], [2, 3], [-0.1])


def test_llama_server_logprobs_line_up_with_every_sampled_id():
    """llama-server leaves out of logprobs.content a token that ends inside a multi-byte UTF-8 character (here the
    first byte-token of an emoji, as it answered the real SmolLM2): that id gets NaN, every other id its own."""
    from uni_agent.llm.tokens import aligned_logprobs

    ids = [17, 40303, 228, 2]
    entries = [{"id": 17, "logprob": -1.0}, {"id": 228, "logprob": -0.5}, {"id": 2, "logprob": -0.25}]
    assert np.array_equal(aligned_logprobs(ids, entries), [-1.0, np.nan, -0.5, -0.25], equal_nan=True)
    with pytest.raises(Exception, match="do not line up"):
        aligned_logprobs([17, 2], [{"id": 17, "logprob": -1.0}, {"id": 99, "logprob": -1.0}])


def test_token_capture_follows_the_engine_unless_told():
    assert token_capture_for("auto", "llama_cpp") == "llama_server"
    assert token_capture_for("auto", "vllm") == "vllm"
    assert token_capture_for("auto", "external") is None
    assert token_capture_for("vllm", "external") == "vllm"
    assert token_capture_for("off", "llama_cpp") is None


# -- vLLM's fields (a ScriptedLLM double: vLLM needs a GPU) ------------------------------------------------------


def test_vllm_token_fields_are_read_and_requested():
    def policy(body):
        turn = sum(m["role"] == "assistant" for m in body["messages"])
        prompt = [100, 101, 102] + [7, 8, 9, 103] * turn
        return {**tool_call_message("submit", {}), "_response": {"prompt_token_ids": prompt},
                "_choice": {"token_ids": [7, 8, 9],
                            "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": -0.5} for t in (7, 8, 9)]}},
                "_usage": {"prompt_tokens": len(prompt)}}

    async def main():
        with ScriptedLLM(policy) as server:
            client = ChatClient(server.base_url, "m", token_capture="vllm")
            messages = [{"role": "user", "content": "hi"}]
            first = await client.chat(messages)
            messages += [{"role": "assistant", "content": ""}, {"role": "user", "content": "more"}]
            second = await client.chat(messages)
            await client.aclose()
            return server.requests, first, second

    requests, first, second = asyncio.run(main())
    assert all(r["return_token_ids"] and r["logprobs"] and r["top_logprobs"] == 0 and r["return_tokens_as_token_ids"]
               for r in requests)
    assert first.tokens == TurnTokens([100, 101, 102], [7, 8, 9], [-0.5] * 3)
    seq = build_sequence([first.tokens, second.tokens])
    assert seq.drift is None and seq.input_ids == [100, 101, 102, 7, 8, 9, 103, 7, 8, 9]


def test_an_engine_without_the_fields_gives_a_reply_and_a_reason():
    async def main():
        with ScriptedLLM(lambda body: tool_call_message("submit", {})) as server:
            client = ChatClient(server.base_url, "m", token_capture="vllm")
            reply = await client.chat([{"role": "user", "content": "hi"}])
            await client.aclose()
            return reply

    reply = asyncio.run(main())
    assert reply.tool_calls and reply.tokens is None
    assert reply.tokens_missing == "vllm: the answer has no logprobs.content"


# -- the real llama.cpp server ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """llama-server (the project's build) serving SmolLM2-135M-Instruct on a free port, for this module's tests."""
    from uni_agent.engines.llama_build import find_binary
    from uni_agent.engines.llama_cpp import default_model_path, server_command
    from uni_agent.engines.server import free_port

    binary = find_binary("cpu")
    assert binary is not None, "no llama-server build: run examples/setup.sh"
    port = free_port("127.0.0.1")
    command = server_command(str(binary), default_model_path(), "smol", host="127.0.0.1", port=port, slots=2,
                             context_length=4096, threads=2, gpu=False)
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "llama-server did not come up"
            time.sleep(0.3)
        yield url
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(30)


def _detokenize(url: str, ids: list[int]) -> str:
    return httpx.post(f"{url}/detokenize", json={"tokens": [int(t) for t in ids]}, timeout=30).json()["content"]


def _special(url: str, text: str) -> list[int]:
    return httpx.post(f"{url}/tokenize", json={"content": text, "parse_special": True}, timeout=30).json()["tokens"]


async def _conversation(url: str, edit_before_third: bool):
    """Three calls of one conversation through ChatClient with token capture; optionally an observation edited
    after the model saw it."""
    client = ChatClient(f"{url}/v1", "smol", token_capture="llama_server",
                        sampling={"temperature": 0.8, "max_tokens": 40, "seed": 7})
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2 + 2?"}]
    replies, context = [], None
    try:
        for turn in range(3):
            reply = await client.chat(messages, context=context)  # as the agent loop calls it
            context = reply.context
            replies.append(reply)
            messages.append({"role": "assistant", "content": reply.raw_text})  # as the agent loop keeps it
            messages.append({"role": "user", "content": f"Observation {turn}: the shell printed {turn * 7}."})
            if edit_before_third and turn == 1:
                messages[3]["content"] = "Observation 0: EDITED after the model saw it."
    finally:
        await client.aclose()
    return messages, replies


@pytest.mark.llm
def test_real_server_ids_decode_to_the_messages_and_mask_and_logprobs_line_up(llama_server):
    messages, replies = asyncio.run(_conversation(llama_server, edit_before_third=False))
    end_of_turn = _special(llama_server, "<|im_end|>")
    for reply in replies:
        tokens = reply.tokens
        assert tokens is not None, reply.tokens_missing
        assert len(tokens.prompt_ids) == reply.prompt_tokens  # what the engine counted for this call
        assert len(tokens.completion_ids) == reply.completion_tokens
        # The sampled ids are the text the assistant message holds (and the end-of-turn token the model sampled).
        sampled = tokens.completion_ids[:-1] if tokens.completion_ids[-1:] == end_of_turn else tokens.completion_ids
        assert _detokenize(llama_server, sampled) == reply.raw_text
        assert reply.content.strip() == reply.raw_text.strip()  # the server's parsed content: the same words
        finite = [lp for lp in tokens.logprobs if lp == lp]  # NaN: a token ending inside a UTF-8 character
        assert all(lp <= 0 for lp in finite) and len(finite) >= len(tokens.logprobs) // 2
    seq = build_sequence([r.tokens for r in replies])
    assert seq.drift is None, seq.drift
    assert len(seq.input_ids) == len(seq.loss_mask) == len(seq.logprobs)
    assert sum(seq.loss_mask) == sum(len(r.tokens.completion_ids) for r in replies)
    ids, mask, logprobs = map(np.array, (seq.input_ids, seq.loss_mask, seq.logprobs))
    assert (logprobs[mask == 0] == 0).all() and (logprobs[mask == 1] < 0).any()
    assert np.isnan(logprobs).sum() == sum(np.isnan(r.tokens.logprobs).sum() for r in replies)
    # Each run of 1s is one reply, in order, and decodes to that assistant message; the 0s between are the rest.
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    spans = [ids[a:b].tolist() for a, b in zip(edges[::2], edges[1::2])]
    assert [_detokenize(llama_server, s).removesuffix("<|im_end|>") for s in spans] == \
        [m["content"] for m in messages if m["role"] == "assistant"]
    assert "What is 2 + 2?" in _detokenize(llama_server, ids[mask == 0].tolist())


@pytest.mark.llm
def test_real_server_an_observation_edited_between_turns_is_caught_as_drift(llama_server):
    messages, replies = asyncio.run(_conversation(llama_server, edit_before_third=True))
    seq = build_sequence([r.tokens for r in replies])
    assert seq.drift is not None and seq.drift["turn"] == 3, seq.drift
    assert seq.input_ids[: len(replies[2].tokens.prompt_ids)] == replies[2].tokens.prompt_ids  # what call 3 saw
    assert sum(seq.loss_mask[seq.drift["position"]:]) == 0  # nothing from the drift on is trained
    assert "EDITED" in _detokenize(llama_server, seq.input_ids)


@pytest.mark.llm
def test_run_writes_token_columns_and_masks_rollouts_that_did_not_submit(llama_server, rows, tmp_path, dask_client):
    """A whole run on the real engine with mask_abnormal_exit_traj on and no `submit` tool: every rollout ends at
    max_turns, so every row is masked and says why, while its tokens are still there."""
    agents = AgentConfigs.load(AGENT_CONFIG).override_all({
        "mask_abnormal_exit_traj": True, "tools": [{"name": "execute_bash"}, {"name": "str_replace_editor"}]})
    out = run(rows[:2], agents, client=dask_client, engine="llama_cpp", n=1, max_turns=2, max_tokens=96,
              output_dir=str(tmp_path), progress=False, verify=False)
    results = out.results
    assert len(results) == 2
    schema = pq.read_schema(next((tmp_path / "results").glob("part-*.parquet")))
    assert str(schema.field("input_ids").type) == "list<element: int32>"
    assert str(schema.field("loss_mask").type) == "list<element: int32>"
    assert str(schema.field("logprobs").type) == "list<element: float>"
    for row in results.itertuples():
        assert row.exit_reason == "max_turns" and row.failure_kind == "model" and row.failure_cause == "max_turns"
        assert row.masked and row.mask_reason == "mask_abnormal_exit_traj: exit_reason max_turns"
        assert row.token_source == "llama_server" and pd.isna(row.tokens_missing)
        if not pd.isna(row.token_drift):  # a sampled split that re-tokenizes otherwise ("exec"+"ute" vs "execute")
            assert json.loads(row.token_drift)["turn"] == 2
        assert len(row.input_ids) == len(row.loss_mask) == len(row.logprobs) > 0
        assert sum(row.loss_mask) == 0
        assert (np.asarray(row.logprobs) < 0).sum() > 0  # the sampled tokens' logprobs are kept
        replies = [m["content"] for m in json.loads(row.messages) if m["role"] == "assistant"]
        text = _detokenize(llama_server, list(row.input_ids))
        assert all(reply in text for reply in replies)
    # The loader in docs/outputs.md gives padded arrays of these rows.
    readme = (REPO_ROOT / "docs" / "outputs.md").read_text()
    snippet = readme.split("Loading a run's results into padded arrays", 1)[1].split("```python", 1)[1].split("```")[0]
    namespace: dict = {}
    exec(snippet.replace('"outputs/quickstart/results"', repr(str(tmp_path / "results"))), namespace)
    width = max(len(ids) for ids in results.input_ids)
    assert namespace["input_ids"].shape == namespace["loss_mask"].shape == namespace["old_logprobs"].shape == (2, width)
    assert namespace["attention_mask"].sum() == sum(len(ids) for ids in results.input_ids)
    assert namespace["loss_mask"].sum() == 0 and namespace["rewards"].shape == (2,)
    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest["sessions"][0]["token_capture"] == "llama_server"
    assert manifest["model"]["sha256"] and len(manifest["model"]["sha256"]) == 64


def test_parquet_size_script_measures_both_schemas_of_the_same_rows(tmp_path):
    import runpy

    from uni_agent.driver.results import ResultStore
    from uni_agent.episode.rollout import RolloutResult

    store = ResultStore(tmp_path)
    for i in range(4):
        store.add(RolloutResult("r", f"t{i}", 0, "d", "a", "submitted", messages=[{"role": "user"}],
                                input_ids=list(range(500)), loss_mask=[0] * 250 + [1] * 250,
                                logprobs=[0.0] * 250 + [-0.5] * 250))
    store.flush()
    sizes = runpy.run_path(str(REPO_ROOT / "examples" / "parquet_size.py"))["sizes"](tmp_path)
    assert sizes["rollouts"] == 4 and sizes["mean_tokens_per_rollout"] == 500
    assert sizes["after_bytes_per_rollout"] > sizes["before_bytes_per_rollout"] > 0
