"""The model gateway over real HTTP: OpenAI chat completions with and without streaming, function calling (passed
through, or described in the prompt and parsed back with our parsers), budgets, tokens per rollout, chains.

The engine behind it is the scripted endpoint (uni_agent.testing.scripted_llm, a real HTTP server) reached through the
real ChatClient; the token columns against a real engine are in test_harness_tokens.py (llama-server).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import pytest

from uni_agent.episode.exit_reason import ExitReason
from uni_agent.episode.rollout import RolloutResult
from uni_agent.harness.gateway import Gateway, Lease
from uni_agent.llm import ChatClient
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

T = TypeVar("T")
BASH = {"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def with_gateway(policy: Callable[[dict[str, Any]], dict[str, Any]],
                 body: Callable[[Gateway, ChatClient, ScriptedLLM], Awaitable[T]]) -> T:
    async def main() -> T:
        with ScriptedLLM(policy) as engine:
            client = ChatClient(engine.base_url, "scripted", "the-real-key", max_attempts=1)
            gateway = await Gateway().start(tcp=True)
            try:
                return await body(gateway, client, engine)
            finally:
                await gateway.close()
                await client.aclose()

    return asyncio.run(main())


async def post(gateway: Gateway, token: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as http, http.post(
            f"{gateway.url}/chat/completions", json=body, headers={"Authorization": f"Bearer {token}"}) as answer:
        raw = await answer.read()
        if answer.content_type == "text/event-stream":
            return answer.status, [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
        return answer.status, json.loads(raw)


def lease_for(gateway: Gateway, client: ChatClient, **kwargs: Any) -> Lease:
    lease = Lease(client, "scripted", **{"max_calls": 10, "deadline": None, **kwargs})
    gateway.register(lease)
    return lease


def test_plain_and_streamed_answers_and_the_models_list() -> None:
    def policy(body: dict[str, Any]) -> dict[str, Any]:
        return {"role": "assistant", "content": f"reply {len(body['messages'])}"}

    async def body(gateway: Gateway, client: ChatClient, engine: ScriptedLLM) -> tuple[Any, ...]:
        lease = lease_for(gateway, client)
        first = await post(gateway, lease.token, {"model": "anything", "messages": [{"role": "user", "content": "hi"}]})
        streamed = await post(gateway, lease.token, {"stream": True, "stream_options": {"include_usage": True},
                                                     "messages": [{"role": "user", "content": "hi"}]})
        async with aiohttp.ClientSession() as http, http.get(
                f"{gateway.url}/models", headers={"Authorization": f"Bearer {lease.token}"}) as answer:
            models = await answer.json()
        return first, streamed, models, engine.requests

    first, streamed, models, requests = with_gateway(policy, body)
    status, answer = first
    assert status == 200 and answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "reply 1"}
    assert answer["choices"][0]["finish_reason"] == "stop"
    status, events = streamed
    assert status == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == "reply 1"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert "usage" in chunks[-1] and chunks[-1]["choices"] == []
    assert models["data"][0]["id"] == "scripted"
    # the engine got the run's key and model, never the program's token or model name
    assert all(r["_headers"]["Authorization"] == "Bearer the-real-key" and r["model"] == "scripted" for r in requests)


def test_tools_pass_through_as_function_calls() -> None:
    def policy(body: dict[str, Any]) -> dict[str, Any]:
        assert body["tools"] == [BASH]
        return tool_call_message("bash", {"command": "ls"}, content="looking")

    async def body(gateway: Gateway, client: ChatClient, engine: ScriptedLLM) -> tuple[Any, ...]:
        lease = lease_for(gateway, client)
        plain = await post(gateway, lease.token, {"messages": [{"role": "user", "content": "go"}], "tools": [BASH]})
        streamed = await post(gateway, lease.token, {"messages": [{"role": "user", "content": "go"}],
                                                     "tools": [BASH], "stream": True})
        return plain, streamed

    (status, answer), (_, events) = with_gateway(policy, body)
    call = answer["choices"][0]["message"]["tool_calls"][0]
    assert status == 200 and answer["choices"][0]["finish_reason"] == "tool_calls"
    assert call["type"] == "function" and json.loads(call["function"]["arguments"]) == {"command": "ls"}
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1] if json.loads(e)["choices"]]
    streamed_call = next(d["tool_calls"][0] for d in deltas if "tool_calls" in d)
    assert streamed_call["index"] == 0 and streamed_call["function"]["name"] == "bash"


def test_tools_in_the_prompt_are_parsed_back_and_the_model_sees_its_own_text() -> None:
    """tools_in: prompt: the engine gets no `tools` but their description (hermes); the model's text call comes back
    to the program as a structured call; the program's echo of it and its tool result reach the engine as the
    model's own text and an observation message."""
    said = 'Let me look.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        return {"role": "assistant", "content": said}

    async def body(gateway: Gateway, client: ChatClient, engine: ScriptedLLM) -> tuple[Any, ...]:
        lease = lease_for(gateway, client, tools_in="prompt", tool_parser="hermes")
        conversation = [{"role": "system", "content": "You are a bot."}, {"role": "user", "content": "go"}]
        _, first = await post(gateway, lease.token, {"messages": conversation, "tools": [BASH]})
        message = first["choices"][0]["message"]
        call = message["tool_calls"][0]
        conversation += [message, {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
        await post(gateway, lease.token, {"messages": conversation, "tools": [BASH]})
        return message, engine.requests, lease

    message, requests, lease = with_gateway(policy, body)
    assert message["content"] == "Let me look." and json.loads(
        message["tool_calls"][0]["function"]["arguments"]) == {"command": "ls -la"}
    assert all("tools" not in r for r in requests)
    assert "<tool_call>" in requests[0]["messages"][0]["content"] and "bash" in requests[0]["messages"][0]["content"]
    assert requests[1]["messages"][2:] == [{"role": "assistant", "content": said},
                                           {"role": "user", "content": "Observation from `bash`:\na.txt"}]
    assert len(lease.calls.chains) == 1 and lease.calls.chains[0].calls == 2


def test_a_call_over_the_budget_is_refused_and_ends_the_episode() -> None:
    async def body(gateway: Gateway, client: ChatClient, engine: ScriptedLLM) -> tuple[Any, ...]:
        lease = lease_for(gateway, client, max_calls=2)
        statuses = [(await post(gateway, lease.token, {"messages": [{"role": "user", "content": "x"}]}))
                    for _ in range(3)]
        return statuses, lease, engine.num_requests

    statuses, lease, engine_calls = with_gateway(lambda b: {"role": "assistant", "content": "ok"}, body)
    assert [s for s, _ in statuses] == [200, 200, 403]
    assert statuses[2][1]["error"]["code"] == "budget_exceeded" and "2 model calls" in statuses[2][1]["error"]["message"]
    assert lease.ending.reason == ExitReason.MAX_TURNS and lease.ended.is_set() and engine_calls == 2


def test_a_token_reaches_only_its_own_rollout() -> None:
    async def body(gateway: Gateway, client: ChatClient, engine: ScriptedLLM) -> tuple[Any, ...]:
        a, b = lease_for(gateway, client), lease_for(gateway, client)
        await post(gateway, a.token, {"messages": [{"role": "user", "content": "from a"}]})
        await post(gateway, b.token, {"messages": [{"role": "user", "content": "from b"}]})
        await post(gateway, b.token, {"messages": [{"role": "user", "content": "from b again"}]})
        unknown = await post(gateway, "ua-made-up", {"messages": [{"role": "user", "content": "x"}]})
        real_key = await post(gateway, "the-real-key", {"messages": [{"role": "user", "content": "x"}]})
        gateway.unregister(a)
        after = await post(gateway, a.token, {"messages": [{"role": "user", "content": "x"}]})
        return a, b, unknown, real_key, after

    a, b, unknown, real_key, after = with_gateway(lambda b: {"role": "assistant", "content": "ok"}, body)
    assert a.token != b.token and (a.calls.calls, b.calls.calls) == (1, 2)
    assert [c.conversation[0]["content"] for c in a.calls.chains] == ["from a"]
    assert unknown[0] == real_key[0] == after[0] == 401


def test_a_rewritten_history_starts_a_new_chain_with_its_boundary_recorded() -> None:
    async def body(gateway: Gateway, client: ChatClient, engine: ScriptedLLM) -> Lease:
        lease = lease_for(gateway, client)
        history = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
        for step in range(3):
            _, answer = await post(gateway, lease.token, {"messages": history})
            history += [answer["choices"][0]["message"], {"role": "user", "content": f"output {step}"}]
        summary = [history[0], {"role": "user", "content": "summary of the work so far"}]  # truncation
        _, answer = await post(gateway, lease.token, {"messages": summary})
        await post(gateway, lease.token, {"messages": [*summary, answer["choices"][0]["message"],
                                                       {"role": "user", "content": "go on"}]})
        return lease

    lease = with_gateway(lambda b: {"role": "assistant", "content": f"step {len(b['messages'])}"}, body)
    result = RolloutResult(run_id="r", instance_id="i", rollout=0, data_source="d", agent_name="a", exit_reason="submitted")
    lease.calls.fill(result)
    chains = result.chains
    assert [(c["first_call"], c["calls"]) for c in chains] == [(1, 3), (4, 2)]
    assert chains[1]["reason"].startswith("history rewritten: message 1 (user)")
    messages = result.messages
    assert chains[1]["message_start"] == 7 and messages[7]["content"] == "s" and len(messages) == 7 + 5
    assert result.num_turns == 5


def test_a_rollout_s_door_answers_its_own_token_only() -> None:
    """Each rollout's relay connects to a socket of its own, which refuses every other rollout's token: a token that
    got out of its sandbox still could not reach another rollout's session."""

    async def main() -> tuple[Any, ...]:
        with ScriptedLLM(lambda body: {"role": "assistant", "content": "ok"}) as engine:
            client = ChatClient(engine.base_url, "scripted", "the-real-key", max_attempts=1)
            gateway = await Gateway().start()
            try:
                a, b = (Lease(client, "scripted", max_calls=10, deadline=None) for _ in range(2))
                for lease in (a, b):
                    gateway.register(lease)
                    await gateway.door(lease)
                door_a = next(path for path, lease in gateway._doors.items() if lease is a)

                async def status(token: str) -> int:
                    async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=door_a)) as http, http.post(
                            "http://gateway/v1/chat/completions", headers={"Authorization": f"Bearer {token}"},
                            json={"messages": [{"role": "user", "content": "x"}]}) as answer:
                        return answer.status

                statuses = (await status(a.token), await status(b.token), await status("ua-made-up"))
                await gateway.close_door(a)
                return statuses, (a.calls.calls, b.calls.calls), Path(door_a).exists(), len(gateway._doors)
            finally:
                await gateway.close()
                await client.aclose()

    statuses, calls, door_left, doors = asyncio.run(main())
    assert statuses == (200, 401, 401) and calls == (1, 0)
    assert not door_left and doors == 1
