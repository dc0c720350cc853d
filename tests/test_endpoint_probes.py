"""What a run asks an engine before its rollouts: `check_endpoint` (reachable? which models?) and `engine_versions`
(what run.json records), each against a real HTTP server on loopback whose answers the test chooses."""

from __future__ import annotations

import asyncio
import socket

import pytest
from aiohttp import web
from loopback_http import served

from uni_agent.driver.manifest import engine_versions
from uni_agent.llm import LLMError, check_endpoint


class Endpoint:
    """An aiohttp server answering each path with the (status, body) the test set; any other path is a 404."""

    def __init__(self, answers: dict[str, tuple[int, str]]):
        self.answers, self.asked = answers, []

    async def handle(self, request: web.Request) -> web.Response:
        self.asked.append((request.path, request.headers.get("Authorization")))
        status, body = self.answers.get(request.path, (404, "not found"))
        return web.Response(status=status, text=body, content_type="application/json")

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_get("/{tail:.*}", self.handle)
        self._served = served(app)
        return await self._served.__aenter__()

    async def __aexit__(self, *exc: object) -> None:
        await self._served.__aexit__(*exc)


def test_check_endpoint_lists_the_models_and_sends_the_key() -> None:
    async def go() -> None:
        endpoint = Endpoint({"/v1/models": (200, '{"data": [{"id": "m1"}, {"id": "m2"}]}')})
        async with endpoint as url:
            assert await check_endpoint(url + "/", api_key="sk-test") == ["m1", "m2"]
        assert endpoint.asked == [("/v1/models", "Bearer sk-test")]
    asyncio.run(go())


def test_check_endpoint_names_the_url_and_the_status_of_an_error() -> None:
    async def go() -> None:
        async with Endpoint({"/v1/models": (503, '{"error": "loading model"}')}) as url:
            with pytest.raises(LLMError, match=rf"{url}/models answered HTTP 503: .*loading model"):
                await check_endpoint(url)
        async with Endpoint({"/v1/models": (200, "not json")}) as url:
            assert await check_endpoint(url) == []  # reachable, lists nothing: the run then asks for --model
    asyncio.run(go())


def test_check_endpoint_fails_fast_on_a_port_nobody_listens_on() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(LLMError, match=rf"LLM endpoint {url} is unreachable: ClientConnectorError"):
        asyncio.run(check_endpoint(url, timeout=5))


def test_engine_versions_keeps_what_each_engine_says_and_skips_what_it_cannot() -> None:
    async def go() -> None:
        llama = Endpoint({"/props": (200, '{"build_info": "b6000-abc", "total_slots": 8}')})
        vllm = Endpoint({"/version": (200, '{"version": "0.11.0"}')})
        odd = Endpoint({"/version": (200, '["not", "an", "object"]'), "/props": (500, "boom")})
        async with llama as a, vllm as b, odd as c:
            found = await engine_versions([a, b, c], api_key="sk-x")
        assert found == [{"url": a, "build_info": "b6000-abc"}, {"url": b, "version": "0.11.0"}, {"url": c}]
        assert ("/props", "Bearer sk-x") in llama.asked
    asyncio.run(go())
