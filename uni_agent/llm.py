"""An OpenAI-compatible chat client: one POST per turn, transient faults retried with backoff (tenacity).

With `token_capture` it also keeps each call's tokens exactly as the engine reports them (see TOKEN_CAPTURE): the
prompt ids the engine saw, the completion ids it sampled and their logprobs. A reply without them still works as a
reply; its `tokens` is None and `tokens_missing` says why."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from .redact import redact
from .trajectory import TurnTokens

log = structlog.get_logger("uni_agent.llm")


class LLMError(RuntimeError):
    """The endpoint failed for good (after retries) or answered something unusable."""


class TransientLLMError(LLMError):
    """Worth retrying: 429/5xx, a timeout, a dropped connection, a garbled or empty answer."""


class EndpointDownError(TransientLLMError):
    """Nothing accepts connections at the endpoint: its server is down (or not up yet)."""


class ContextLimitError(LLMError):
    """The conversation no longer fits the model's context window."""


class _NoTokens(Exception):
    """The engine's answer lacks the token fields asked for (the reply itself is fine)."""


@dataclass
class ChatReply:
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    tokens: TurnTokens | None = None
    tokens_missing: str | None = None  # why `tokens` is None when token capture was asked for
    token_source: str = ""  # the TOKEN_CAPTURE protocol asked for, "" when none
    # llama_server: the text exactly as sampled, before the server's chat parsing (which trims whitespace and code
    # fences from `content`); kept in the conversation, the next prompt then continues what the model produced
    raw_text: str | None = None
    context: TokenContext | None = None  # what the rollout's next call continues (llama_server token-in)


@dataclass
class TokenContext:
    """The ids of a rollout's last call (prompt + sampled) and the text they render, for the next call to extend."""

    ids: list[int]
    text: str


# How each engine gives a chat call's tokens (request fields looked up in the pinned versions' sources):
# - vllm (0.33): `return_token_ids` adds the top-level `prompt_token_ids` and the choice's `token_ids`; `logprobs`
#   with `top_logprobs: 0` gives each sampled token's logprob; `return_tokens_as_token_ids` names each logprob entry
#   "token_id:N" (the ids again, for a server without `return_token_ids`).
# - llama_server (llama.cpp's server as vendored in llama-cpp-python 0.3.36): `return_tokens` with `verbose` gives every
#   sampled id (__verbose.tokens, the end-of-turn token included); `logprobs` with `top_logprobs: 1` gives id and
#   logprob per token (choices[0].logprobs.content), except for a token that ends inside a multi-byte UTF-8 character
#   (the server holds its text back, and its logprob with it): that token's logprob is NaN. The prompt ids come from
#   the same server: POST /apply-template with the same body renders the prompt exactly as /v1/chat/completions does,
#   and POST /tokenize with add_special (as the completion path tokenizes) gives its ids, checked against usage.
# Both report logprobs of the model's own distribution, before temperature and top_p.
TOKEN_CAPTURE = ("vllm", "llama_server")
_TOKEN_FIELDS = {
    "vllm": {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True},
    "llama_server": {"logprobs": True, "top_logprobs": 1, "return_tokens": True, "verbose": True},
}


CONTEXT_MARKERS = ("context length", "context window", "maximum context", "exceed context", "too many tokens",
                   "context size")


def token_capture_for(setting: str, engine: str) -> str | None:
    """The TOKEN_CAPTURE protocol a run uses: `auto` picks the engine's own; an external endpoint is asked for none
    unless told which protocol it speaks (unknown request fields can make a strict server refuse every call)."""
    if setting == "auto":
        return {"llama_cpp": "llama_server", "vllm": "vllm"}.get(engine)
    return None if setting == "off" else setting


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
    ):
        if token_capture not in (None, *TOKEN_CAPTURE):
            raise ValueError(f"token_capture {token_capture!r}: expected one of {TOKEN_CAPTURE} or None")
        self.token_capture = token_capture
        self.token_in = token_in  # llama_server: send prompts as ids (_token_in) when the tools are in the prompt
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.max_attempts = max_attempts
        self.retry_unreachable = retry_unreachable  # False when a router can send the request to another replica
        self.sampling = dict(sampling or {})
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # A dead host should not take the whole request timeout to notice: connecting gets at most 30 s.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=min(timeout, 30), sock_read=timeout)
        # One aiohttp session with unlimited connections, opened on first use (it belongs to the event loop that
        # uses it). It replaced httpx here: per request, httpx cost 2.9-3.5 ms of the worker's CPU and aiohttp
        # 1.3-1.6 ms (same endpoint, same run, 100 in flight), most of the framework's CPU per turn.
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=self._timeout,
                connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60))
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def chat(
        self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
        response_format: dict[str, Any] | None = None, context: TokenContext | None = None,
    ) -> ChatReply:
        """One model call. `context` is the previous call's reply.context (llama_server token-in, see _token_in)."""
        body: dict[str, Any] = {"model": self.model, "messages": messages, **self.sampling}
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if response_format:
            body["response_format"] = response_format
        if self.token_capture:
            body.update(_TOKEN_FIELDS[self.token_capture])
        retrying = AsyncRetrying(
            retry=retry_if_exception(self._worth_retrying),
            stop=stop_after_attempt(self.max_attempts),
            wait=wait_exponential_jitter(multiplier=1, max=30),
            before_sleep=_log_retry,
            reraise=True,
        )
        if self.token_capture == "llama_server" and self.token_in and not tools:
            async for attempt in retrying:
                with attempt:
                    reply = await self._token_in(body, context)
            return reply
        async for attempt in retrying:
            with attempt:
                reply, data = await self._post(body)
        if self.token_capture:
            reply.token_source = self.token_capture
            try:
                reply.tokens, reply.raw_text = await self._tokens(body, data)
            except _NoTokens as exc:
                reply.tokens_missing = f"{self.token_capture}: {exc}"
        return reply

    def _worth_retrying(self, exc: BaseException) -> bool:
        return isinstance(exc, TransientLLMError) and (self.retry_unreachable or not isinstance(exc, EndpointDownError))

    async def _tokens(self, body: dict[str, Any], data: dict[str, Any]) -> tuple[TurnTokens, str | None]:
        """The call's tokens, and the raw sampled text where the engine gives it."""
        raw_text = None
        choice = data["choices"][0]
        entries = (choice.get("logprobs") or {}).get("content")
        if not isinstance(entries, list):
            raise _NoTokens("the answer has no logprobs.content")
        try:
            if self.token_capture == "vllm":
                logprobs = [float(e["logprob"]) for e in entries]
                prompt = data.get("prompt_token_ids")
                completion = choice.get("token_ids") or [int(e["token"].removeprefix("token_id:")) for e in entries]
                if not isinstance(prompt, list):
                    raise _NoTokens("the answer has no prompt_token_ids (vLLM before return_token_ids)")
            else:
                verbose = data.get("__verbose") or {}
                completion = verbose.get("tokens")
                if not isinstance(completion, list):
                    raise _NoTokens("the answer has no __verbose.tokens (a llama-server without return_tokens)")
                logprobs = _aligned_logprobs(completion, entries)
                prompt = await self._llama_server_prompt_ids(body)
            tokens = TurnTokens([int(t) for t in prompt], [int(t) for t in completion], logprobs)
            if self.token_capture == "llama_server" and isinstance(verbose.get("content"), str):
                raw_text = verbose["content"]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _NoTokens(f"unreadable token fields ({type(exc).__name__}: {exc})") from None
        reported = (data.get("usage") or {}).get("prompt_tokens")
        if reported is not None and int(reported) != len(tokens.prompt_ids):
            raise _NoTokens(f"{len(tokens.prompt_ids)} prompt ids but the engine counted {reported}")
        return tokens, raw_text

    async def _token_in(self, body: dict[str, Any], context: TokenContext | None) -> ChatReply:
        """llama_server token-in: the prompt sent as ids, continuing the rollout's previous call exactly.

        The server renders the conversation with its chat template (/apply-template, as its chat endpoint would);
        when that text begins with the text of the previous call's prompt and sampled tokens, only the rest is
        tokenized and appended to those very ids, so the model always sees its own sampled tokens (no re-tokenizing
        drift). /completion then samples from the ids (the same sampling, grammar and logprobs as the chat path), and
        the reply is the raw sampled text: tool calls are parsed from text (tools_in: prompt)."""
        root = self.base_url.removesuffix("/v1")
        rendered = _json(*await self._request(f"{root}/apply-template", body), self.base_url)["prompt"]
        if context is not None and rendered.startswith(context.text):
            ids = context.ids + await self._tokenize(root, rendered[len(context.text):], add_special=False)
        else:  # a first call, or a conversation that no longer continues the last one (the sequence records it)
            ids = await self._tokenize(root, rendered, add_special=True)
        request: dict[str, Any] = {**self.sampling, "prompt": ids, "n_probs": 1, "return_tokens": True,
                                   "cache_prompt": True}
        response_format = body.get("response_format") or {}
        if response_format.get("type") in ("json_object", "json_schema"):
            schema = response_format.get("schema") or (response_format.get("json_schema") or {}).get("schema")
            request["json_schema"] = schema or {"type": "object"}
        response, latency = await self._request(f"{root}/completion", request)
        data = _json(response, latency, self.base_url)
        try:
            sampled = [int(t) for t in data["tokens"]]
            content = str(data["content"])
            logprobs = _aligned_logprobs(sampled, data.get("completion_probabilities") or [])
        except (KeyError, TypeError, ValueError, _NoTokens) as exc:
            raise TransientLLMError(f"{self.base_url}: malformed /completion answer ({exc!r})") from exc
        finish = "length" if data.get("stop_type") == "limit" else "stop"
        if finish == "length" and not content:
            raise ContextLimitError(f"{self.base_url}: the model hit its token limit before writing anything")
        detokenized = _json(*await self._request(f"{root}/detokenize", {"tokens": sampled}), self.base_url)
        reply = ChatReply(content=content, tool_calls=[], finish_reason=finish,  # the counts as the engine made them
                          prompt_tokens=int(data.get("tokens_evaluated") or 0),
                          completion_tokens=int(data.get("tokens_predicted") or 0), latency_s=latency,
                          tokens=TurnTokens(ids, sampled, logprobs), token_source="llama_server", raw_text=content)
        reply.context = TokenContext(ids + sampled, rendered + detokenized["content"])
        return reply

    async def _tokenize(self, root: str, text: str, add_special: bool) -> list[int]:
        body = {"content": text, "add_special": add_special, "parse_special": True}
        return [int(t) for t in _json(*await self._request(f"{root}/tokenize", body), self.base_url)["tokens"]]

    async def _llama_server_prompt_ids(self, body: dict[str, Any]) -> list[int]:
        root = self.base_url.removesuffix("/v1")
        try:
            rendered = await self._send(f"{root}/apply-template", body)
            if rendered.status_code >= 400:
                raise _NoTokens(f"/apply-template answered HTTP {rendered.status_code}")
            ids = await self._send(f"{root}/tokenize", {"content": rendered.json()["prompt"], "add_special": True,
                                                        "parse_special": True})
            if ids.status_code >= 400:
                raise _NoTokens(f"/tokenize answered HTTP {ids.status_code}")
            return ids.json()["tokens"]
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
            raise _NoTokens(f"could not get the prompt ids ({type(exc).__name__}: {exc})") from None

    async def _send(self, path: str, body: dict[str, Any]) -> HttpAnswer:
        """POST `body` as JSON to `path` (under base_url, or absolute); the answer read in full."""
        url = path if "://" in path else self.base_url + path
        async with self._http().post(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}) as response:
            return HttpAnswer(response.status, await response.read())

    async def _request(self, path: str, body: dict[str, Any]) -> tuple[HttpAnswer, float]:
        """POST to `path` (under base_url, or absolute), transport and HTTP errors mapped to the LLMError kinds."""
        started = time.monotonic()
        try:
            response = await self._send(path, body)
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            raise EndpointDownError(f"{self.base_url}: cannot connect: {type(exc).__name__}: {exc}") from exc
        except (aiohttp.ServerTimeoutError, asyncio.TimeoutError) as exc:
            raise TransientLLMError(f"{self.base_url}: read timeout, no answer within {self._timeout.sock_read:g}s "
                                    f"({type(exc).__name__})") from exc
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError) as exc:
            raise TransientLLMError(f"{self.base_url}: connection dropped mid-answer: {type(exc).__name__}: {exc}"
                                    ) from exc
        except aiohttp.ClientError as exc:
            raise TransientLLMError(f"{self.base_url}: {type(exc).__name__}: {exc}") from exc
        latency = time.monotonic() - started
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientLLMError(f"{self.base_url}: HTTP {response.status_code}: {response.text[:300]}")
        if response.status_code >= 400:
            text = response.text[:1000]
            if any(marker in text.lower() for marker in CONTEXT_MARKERS):
                raise ContextLimitError(f"{self.base_url}: {text}")
            raise LLMError(f"{self.base_url}: HTTP {response.status_code}: {text}")
        return response, latency

    async def _post(self, body: dict[str, Any]) -> tuple[ChatReply, dict[str, Any]]:
        response, latency = await self._request("/chat/completions", body)
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


@dataclass
class HttpAnswer:
    """An HTTP answer read in full (the part of the response the client looks at)."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.body)


def _json(response: HttpAnswer, latency: float, where: str) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError as exc:
        raise TransientLLMError(f"{where}: malformed answer ({exc!r}): {response.text[:300]}") from exc
    if not isinstance(data, dict):
        raise TransientLLMError(f"{where}: malformed answer: {response.text[:300]}")
    return data


def _aligned_logprobs(ids: list[int], entries: list[dict[str, Any]]) -> list[float]:
    """One logprob per sampled id from llama-server's entries, which skip the ids that end inside a multi-byte UTF-8
    character (NaN for those)."""
    out, j = [], 0
    for token in ids:
        if j < len(entries) and int(entries[j]["id"]) == int(token):
            out.append(float(entries[j]["logprob"]))
            j += 1
        else:
            out.append(float("nan"))
    if j != len(entries):
        raise _NoTokens(f"the logprobs do not line up with the sampled ids ({j} of {len(entries)} matched)")
    return out


async def check_endpoint(base_url: str, api_key: str | None = None, timeout: float = 10) -> list[str]:
    """Fail fast, naming the URL, when an endpoint is unreachable; returns the model ids it serves."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout, headers=headers) as http:
            response = await http.get(base_url.rstrip("/") + "/models")
    except httpx.HTTPError as exc:
        raise LLMError(f"LLM endpoint {base_url} is unreachable: {type(exc).__name__}: {exc}") from None
    if response.status_code >= 400:
        raise LLMError(f"LLM endpoint {base_url}/models answered HTTP {response.status_code}: {response.text[:300]}")
    try:
        return [m["id"] for m in response.json().get("data", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []


def _log_retry(state: RetryCallState) -> None:
    """A retried request may have reached the server already (its answer lost on the way): say so in the log."""
    exc = state.outcome.exception() if state.outcome else None
    log.warning("llm_retry", attempt=state.attempt_number, error=redact(f"{type(exc).__name__}: {exc}"))
