"""Token capture: each model call's tokens exactly as the engine reports them (the prompt ids the engine saw, the
completion ids it sampled and their logprobs), by the engine's protocol, and llama-server's token-in (a prompt sent as
ids, continuing the rollout's previous call). A reply without them still works as a reply; its `tokens` is None and
`tokens_missing` says why."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, Protocol

import aiohttp

from .reply import ChatReply, ContextLimitError, HttpAnswer, TokenContext, TransientLLMError, TurnTokens, answer_json

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
TOKEN_FIELDS = {
    "vllm": {"logprobs": True, "top_logprobs": 0, "return_token_ids": True, "return_tokens_as_token_ids": True},
    "llama_server": {"logprobs": True, "top_logprobs": 1, "return_tokens": True, "verbose": True},
}


class Endpoint(Protocol):
    """The client's side these functions use (ChatClient): where it posts and with which sampling."""

    base_url: str
    sampling: dict[str, Any]

    def send(self, path: str, body: dict[str, Any]) -> Awaitable[HttpAnswer]: ...

    def request(self, path: str, body: dict[str, Any]) -> Awaitable[tuple[HttpAnswer, float]]: ...


class NoTokens(Exception):
    """The engine's answer lacks the token fields asked for (the reply itself is fine)."""


def token_capture_for(setting: str, engine: str) -> str | None:
    """The TOKEN_CAPTURE protocol a run uses: `auto` picks the engine's own; an external endpoint is asked for none
    unless told which protocol it speaks (unknown request fields can make a strict server refuse every call)."""
    if setting == "auto":
        return {"llama_cpp": "llama_server", "vllm": "vllm"}.get(engine)
    return None if setting == "off" else setting


async def read_tokens(client: Endpoint, capture: str, body: dict[str, Any], data: dict[str, Any]
                      ) -> tuple[TurnTokens, str | None]:
    """The call's tokens, and the raw sampled text where the engine gives it."""
    raw_text = None
    choice = data["choices"][0]
    entries = (choice.get("logprobs") or {}).get("content")
    if not isinstance(entries, list):
        raise NoTokens("the answer has no logprobs.content")
    try:
        if capture == "vllm":
            logprobs = [float(e["logprob"]) for e in entries]
            prompt = data.get("prompt_token_ids")
            completion = choice.get("token_ids") or [int(e["token"].removeprefix("token_id:")) for e in entries]
            if not isinstance(prompt, list):
                raise NoTokens("the answer has no prompt_token_ids (vLLM before return_token_ids)")
        else:
            verbose = data.get("__verbose") or {}
            completion = verbose.get("tokens")
            if not isinstance(completion, list):
                raise NoTokens("the answer has no __verbose.tokens (a llama-server without return_tokens)")
            logprobs = aligned_logprobs(completion, entries)
            prompt = await llama_server_prompt_ids(client, body)
        tokens = TurnTokens([int(t) for t in prompt], [int(t) for t in completion], logprobs)
        if capture == "llama_server" and isinstance(verbose.get("content"), str):
            raw_text = verbose["content"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise NoTokens(f"unreadable token fields ({type(exc).__name__}: {exc})") from None
    reported = (data.get("usage") or {}).get("prompt_tokens")
    if reported is not None and int(reported) != len(tokens.prompt_ids):
        raise NoTokens(f"{len(tokens.prompt_ids)} prompt ids but the engine counted {reported}")
    return tokens, raw_text


async def llama_server_token_in(client: Endpoint, body: dict[str, Any], context: TokenContext | None) -> ChatReply:
    """llama_server token-in: the prompt sent as ids, continuing the rollout's previous call exactly.

    The server renders the conversation with its chat template (/apply-template, as its chat endpoint would);
    when that text begins with the text of the previous call's prompt and sampled tokens, only the rest is
    tokenized and appended to those very ids, so the model always sees its own sampled tokens (no re-tokenizing
    drift). /completion then samples from the ids (the same sampling, grammar and logprobs as the chat path), and
    the reply is the raw sampled text: tool calls are parsed from text (tools_in: prompt)."""
    root = client.base_url.removesuffix("/v1")
    rendered = answer_json(*await client.request(f"{root}/apply-template", body), client.base_url)["prompt"]
    if context is not None and rendered.startswith(context.text):
        ids = context.ids + await tokenize(client, root, rendered[len(context.text):], add_special=False)
    else:  # a first call, or a conversation that no longer continues the last one (the sequence records it)
        ids = await tokenize(client, root, rendered, add_special=True)
    request: dict[str, Any] = {**client.sampling, "prompt": ids, "n_probs": 1, "return_tokens": True,
                               "cache_prompt": True}
    response_format = body.get("response_format") or {}
    if response_format.get("type") in ("json_object", "json_schema"):
        schema = response_format.get("schema") or (response_format.get("json_schema") or {}).get("schema")
        request["json_schema"] = schema or {"type": "object"}
    response, latency = await client.request(f"{root}/completion", request)
    data = answer_json(response, latency, client.base_url)
    try:
        sampled = [int(t) for t in data["tokens"]]
        content = str(data["content"])
        logprobs = aligned_logprobs(sampled, data.get("completion_probabilities") or [])
    except (KeyError, TypeError, ValueError, NoTokens) as exc:
        raise TransientLLMError(f"{client.base_url}: malformed /completion answer ({exc!r})") from exc
    finish = "length" if data.get("stop_type") == "limit" else "stop"
    if finish == "length" and not content:
        raise ContextLimitError(f"{client.base_url}: the model hit its token limit before writing anything")
    detokenized = answer_json(*await client.request(f"{root}/detokenize", {"tokens": sampled}), client.base_url)
    reply = ChatReply(content=content, tool_calls=[], finish_reason=finish,  # the counts as the engine made them
                      prompt_tokens=int(data.get("tokens_evaluated") or 0),
                      completion_tokens=int(data.get("tokens_predicted") or 0), latency_s=latency,
                      tokens=TurnTokens(ids, sampled, logprobs), token_source="llama_server", raw_text=content)
    reply.context = TokenContext(ids + sampled, rendered + detokenized["content"])
    return reply


async def tokenize(client: Endpoint, root: str, text: str, add_special: bool) -> list[int]:
    """llama-server's ids for `text` (special tokens parsed; a BOS only with add_special)."""
    body = {"content": text, "add_special": add_special, "parse_special": True}
    return [int(t) for t in answer_json(*await client.request(f"{root}/tokenize", body), client.base_url)["tokens"]]


async def llama_server_prompt_ids(client: Endpoint, body: dict[str, Any]) -> list[int]:
    """The ids of the prompt llama-server's chat endpoint saw for `body` (rendered and tokenized as it does)."""
    root = client.base_url.removesuffix("/v1")
    try:
        rendered = await client.send(f"{root}/apply-template", body)
        if rendered.status_code >= 400:
            raise NoTokens(f"/apply-template answered HTTP {rendered.status_code}")
        ids = await client.send(f"{root}/tokenize", {"content": rendered.json()["prompt"], "add_special": True,
                                                    "parse_special": True})
        if ids.status_code >= 400:
            raise NoTokens(f"/tokenize answered HTTP {ids.status_code}")
        return ids.json()["tokens"]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
        raise NoTokens(f"could not get the prompt ids ({type(exc).__name__}: {exc})") from None


def aligned_logprobs(ids: list[int], entries: list[dict[str, Any]]) -> list[float]:
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
        raise NoTokens(f"the logprobs do not line up with the sampled ids ({j} of {len(entries)} matched)")
    return out
