"""The LLM client's retries: the first try runs outside tenacity's loop, and still counts as attempt 1 of
max_attempts (a real HTTP endpoint answering 500 a set number of times)."""

import asyncio

import pytest

from uni_agent.llm import ChatClient
from uni_agent.llm.client import RetryBudget
from uni_agent.llm.reply import TransientLLMError
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM


def _failing_first(n: int):
    calls = {"n": 0}

    def policy(body):
        calls["n"] += 1
        return Fault(500) if calls["n"] <= n else {"role": "assistant", "content": "done"}
    return policy


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(RetryBudget, "wait", lambda self, state: 0.0)


async def _chat(url: str) -> str:
    client = ChatClient(url, "scripted", max_attempts=3)
    try:
        return (await client.chat([{"role": "user", "content": "hi"}])).content
    finally:
        await client.aclose()


@pytest.mark.parametrize("failures", [0, 1, 2])
def test_transient_failures_within_the_budget_are_retried(failures: int) -> None:
    with ScriptedLLM(_failing_first(failures)) as server:
        assert asyncio.run(_chat(server.base_url)) == "done"
        assert server.num_requests == failures + 1


def test_the_first_try_counts_against_max_attempts() -> None:
    with ScriptedLLM(_failing_first(10)) as server:
        with pytest.raises(TransientLLMError, match="HTTP 500"):
            asyncio.run(_chat(server.base_url))
        assert server.num_requests == 3  # not 4: the try made outside the loop is the loop's attempt 1
