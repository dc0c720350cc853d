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


def test_no_local_port_left_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """EADDRNOTAVAIL from connect(): the host's ephemeral ports are used up (seen at 100,000 in flight to one address).
    The OS error is made here, not provoked: using up 28,000 ports would disturb everything else on the machine."""
    import errno
    from unittest import mock

    import aiohttp

    from uni_agent.llm.reply import EndpointDownError

    key = mock.Mock(ssl=None, host="127.0.0.1", port=9)
    error = aiohttp.ClientConnectorError(key, OSError(errno.EADDRNOTAVAIL, "Cannot assign requested address"))

    async def refused(self, path, body):
        raise error

    monkeypatch.setattr(ChatClient, "send", refused)
    client = ChatClient("http://127.0.0.1:9/v1", "m", max_attempts=1, retry_unreachable=False)
    with pytest.raises(EndpointDownError, match="no local port left .* --base-url URL1,URL2"):
        asyncio.run(client.chat([{"role": "user", "content": "hi"}]))
