"""An OpenAI-compatible chat client: one POST per turn, transient faults retried with backoff (tenacity).

With `token_capture` it also keeps each call's tokens exactly as the engine reports them (tokens.py). The URL it is
given names its engine: an engine placed again elsewhere is reached where it serves now (relocation.py), and the
client reports its engine down and up again (outage.py)."""

from __future__ import annotations

import asyncio
import errno
import json
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, wait_exponential_jitter

from ..fast_json import dumps_json
from ..redact import redact
from .outage import OUTAGES
from .relocation import current_url, scope_of
from .reply import (
    ChatReply,
    ContextLimitError,
    EndpointDownError,
    HttpAnswer,
    LLMError,
    TokenContext,
    TransientLLMError,
)
from .tokens import TOKEN_CAPTURE, TOKEN_FIELDS, NoTokens, llama_server_token_in, read_tokens

log = structlog.get_logger("uni_agent.llm")

CONTEXT_MARKERS = ("context length", "context window", "maximum context", "exceed context", "too many tokens",
                   "context size")


class ChatClient:
    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout: float = 600,
        max_attempts: int = 5,
        sampling: dict[str, Any] | None = None,
        retry_unreachable: bool = True,
        token_capture: str | None = None,
        token_in: bool = True,
        down_wait: float | None = None,
    ):
        if token_capture not in (None, *TOKEN_CAPTURE):
            raise ValueError(f"token_capture {token_capture!r}: expected one of {TOKEN_CAPTURE} or None")
        self.token_capture = token_capture
        # llama_server: send prompts as ids (tokens.llama_server_token_in) when the tools are in the prompt
        self.token_in = token_in
        self.name = base_url.rstrip("/")  # the engine's first URL: base_url is where it serves now
        self._scope = scope_of(api_key)
        self._endpoint = (self._scope, self.name)
        OUTAGES.opened(self, self._endpoint)
        self.model = model
        self.max_attempts = max_attempts
        self.retry_unreachable = retry_unreachable  # False when a router can send the request to another replica
        # Seconds a call waits for an endpoint that accepts no connection (its engine restarting) before it fails;
        # None: such a failure is one more of the max_attempts, like any transient one.
        self.down_wait = down_wait
        self.sampling = dict(sampling or {})
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # A dead host should not take the whole request timeout to notice: connecting gets at most 30 s.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(timeout, 30), sock_read=timeout)
        # One aiohttp session with unlimited connections, opened on first use (it belongs to the event loop that
        # uses it). It replaced httpx here: per request, httpx cost 2.9-3.5 ms of the worker's CPU and aiohttp
        # 1.3-1.6 ms (same endpoint, same run, 100 in flight), most of the framework's CPU per turn.
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        return current_url(self._scope, self.name)

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            OUTAGES.opened(self, self._endpoint)  # again, after an aclose
            self._session = aiohttp.ClientSession(
                headers={**self._headers, "Content-Type": "application/json"}, timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60))
        return self._session

    async def aclose(self) -> None:
        OUTAGES.closed(id(self))
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
        response_format: dict[str, Any] | None = None, context: TokenContext | None = None,
    ) -> ChatReply:
        """One model call. `context` is the previous call's reply.context (llama_server token-in, see
        tokens.llama_server_token_in)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.sampling}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if response_format:
            body["response_format"] = response_format
        if self.token_capture:
            body.update(TOKEN_FIELDS[self.token_capture])
        budget = RetryBudget(self.max_attempts, self.down_wait)
        try:
            if self.token_capture == "llama_server" and self.token_in and not tools:
                return await self._retried(budget, lambda: llama_server_token_in(self, body, context))
            reply, data = await self._retried(budget, lambda: self._post(body))
        except EndpointDownError as exc:
            if budget.waited_s is None:
                raise
            raise EndpointDownError(f"{exc} (still down after waiting {budget.waited_s:.0f} s for it: "
                                    "engine_down_wait)") from exc
        if self.token_capture:
            reply.token_source = self.token_capture
            try:
                reply.tokens, reply.raw_text = await read_tokens(self, self.token_capture, body, data)
            except NoTokens as exc:
                reply.tokens_missing = f"{self.token_capture}: {exc}"
        return reply

    async def _retried(self, budget: RetryBudget, attempt: Callable[[], Awaitable[Any]]) -> Any:
        """`attempt()`, retried as `budget` says. The first try runs outside tenacity: building and driving its
        retry loop cost ~10% of a call's CPU (it inspects every callback), and nearly every call succeeds at once.
        A first failure worth retrying is handed to the loop as its first attempt, so counting, backoff and logs
        are as if the loop had made it."""
        try:
            return await attempt()
        except Exception as exc:
            if not self._worth_retrying(exc):
                raise
            first_failure: Exception | None = exc
        retrying = AsyncRetrying(retry=retry_if_exception(self._worth_retrying), stop=budget.stop, wait=budget.wait,
                                 before_sleep=budget.log, reraise=True)
        async for try_ in retrying:
            with try_:
                if first_failure is not None:
                    failure, first_failure = first_failure, None
                    raise failure
                return await attempt()
        raise AssertionError("unreachable: tenacity either returns the attempt's result or raises (reraise=True)")

    def _worth_retrying(self, exc: BaseException) -> bool:
        return isinstance(exc, TransientLLMError) and (self.retry_unreachable or not isinstance(exc, EndpointDownError))

    async def send(self, path: str, body: dict[str, Any]) -> HttpAnswer:
        """POST `body` as JSON to `path` (under base_url, or absolute); the answer read in full."""
        url = path if "://" in path else self.base_url + path
        async with self._http().post(url, data=dumps_json(body)) as response:
            return HttpAnswer(response.status, await response.read())

    async def request(self, path: str, body: dict[str, Any]) -> tuple[HttpAnswer, float]:
        """POST to `path` (under base_url, or absolute), transport and HTTP errors mapped to the LLMError kinds."""
        try:
            answer = await self._request(path, body)
        except EndpointDownError:
            OUTAGES.down(self._endpoint)
            raise
        except TransientLLMError:
            raise
        except LLMError:  # an answer: the endpoint is up
            OUTAGES.up(self._endpoint)
            raise
        OUTAGES.up(self._endpoint)
        return answer

    async def _request(self, path: str, body: dict[str, Any]) -> tuple[HttpAnswer, float]:
        started = time.monotonic()
        try:
            response = await self.send(path, body)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            hint = ""
            if getattr(getattr(exc, "os_error", None), "errno", None) == errno.EADDRNOTAVAIL:
                hint = (" (this host has no local port left for another connection to it: every process here shares "
                        "the kernel's ephemeral ports, net.ipv4.ip_local_port_range; spread the requests over more "
                        "replicas, --base-url URL1,URL2)")
            raise EndpointDownError(f"{self.base_url}: cannot connect: {type(exc).__name__}: {exc}{hint}") from exc
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as exc:
            raise TransientLLMError(f"{self.base_url}: read timeout, no answer within {self._timeout.sock_read:g}s "
                                    f"({type(exc).__name__})") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            raise TransientLLMError(f"{self.base_url}: connection dropped mid-answer: {type(exc).__name__}: {exc}"
                                    ) from exc
        except aiohttp.ClientError as exc:
            raise TransientLLMError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc
        latency = time.monotonic() - started
        if response.status_code == 503 and "loading model" in response.text[:300].lower():
            # llama-server while it loads its model (a restart, too): down for now, like a refused connection
            raise EndpointDownError(f"{self.base_url}: HTTP 503, not serving yet: {response.text[:300]}")
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientLLMError(f"{self.base_url}: HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            text = response.text[:1000]
            if any(marker in text.lower() for marker in CONTEXT_MARKERS):
                raise ContextLimitError(f"{self.base_url}: {text}")
            raise LLMError(f"{self.base_url}: HTTP {response.status_code}: {text}")
        return response, latency

    async def _post(self, body: dict[str, Any]) -> tuple[ChatReply, dict[str, Any]]:
        response, latency = await self.request("/chat/completions", body)
        try:
            data = response.json()
            choice = data["choices"][0]
            message = choice["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise TransientLLMError(f"{self.base_url}: malformed answer ({exc!r}): {response.text[:300]}") from exc
        usage = data.get("usage") or {}
        if choice.get("finish_reason") == "length" and not (message.get("content") or message.get("tool_calls")):
            raise ContextLimitError(f"{self.base_url}: the model hit its token limit before writing anything")
        return ChatReply(
            content=message.get("content") or "",
            tool_calls=message.get("tool_calls") or [],
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=latency,
        ), data


async def check_endpoint(base_url: str, api_key: str | None = None, timeout: float = 10) -> list[str]:
    """Fail fast, naming the URL, when an endpoint is unreachable; returns the model ids it serves. On aiohttp, as
    the chat calls: httpx's first client imports httpcore, h11 and h2 (0.03 s alone, 0.16 s at a loaded run's
    start, before any rollout could begin)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout)) as http, \
                http.get(base_url.rstrip("/") + "/models") as response:
            status, text = response.status, await response.text(errors="replace")
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        raise LLMError(f"LLM endpoint {base_url} is unreachable: {type(exc).__name__}: {exc}") from None
    if status >= 400:
        raise LLMError(f"LLM endpoint {base_url}/models answered HTTP {status}: {text[:300]}")
    try:
        return [m["id"] for m in json.loads(text).get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


class RetryBudget:
    """When one call stops retrying, and how long it sleeps in between. A transient failure counts against
    `max_attempts` (exponential backoff, up to 30 s). An endpoint that accepts no connection, with `down_wait` set,
    does not: the call polls it (every 0.5 s, growing to 5 s) until it answers again or `down_wait` seconds have
    passed since it went down, so a rollout outlives its engine's restart."""

    def __init__(self, max_attempts: int, down_wait: float | None):
        self.max_attempts, self.down_wait = max_attempts, down_wait
        self.failures = 0  # transient failures other than "down"
        self.down_since: float | None = None
        self.down_polls = 0
        self._backoff = wait_exponential_jitter(multiplier=1, max=30)

    @property
    def waited_s(self) -> float | None:
        return None if self.down_since is None else time.monotonic() - self.down_since

    def _waits_for_it(self, state: RetryCallState) -> bool:
        exc = state.outcome.exception() if state.outcome else None
        return self.down_wait is not None and isinstance(exc, EndpointDownError)

    def stop(self, state: RetryCallState) -> bool:
        if self._waits_for_it(state):
            if self.down_since is None:
                self.down_since = time.monotonic()
            return time.monotonic() - self.down_since >= self.down_wait  # type: ignore[operator]
        self.failures += 1
        return self.failures >= self.max_attempts

    def wait(self, state: RetryCallState) -> float:
        if self._waits_for_it(state):
            self.down_polls += 1
            return min(5.0, 0.5 * 1.5 ** (self.down_polls - 1)) * random.uniform(0.8, 1.2)
        return self._backoff(state)

    def log(self, state: RetryCallState) -> None:
        """A retried request may have reached the server already (its answer lost on the way): say so in the log.
        Polls of a down endpoint are logged once per call, not every few seconds."""
        exc = state.outcome.exception() if state.outcome else None
        if self._waits_for_it(state):
            if self.down_polls == 1:
                log.warning("llm_waiting_for_endpoint", error=redact(f"{type(exc).__name__}: {exc}"),
                            down_wait=self.down_wait)
            return
        log.warning("llm_retry", attempt=state.attempt_number, error=redact(f"{type(exc).__name__}: {exc}"))
