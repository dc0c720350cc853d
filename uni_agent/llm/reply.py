"""What one model call gives back (ChatReply) and how it fails (the LLMError kinds), and an HTTP answer read in full."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..fast_json import loads_json


@dataclass
class TurnTokens:
    """One model call: the prompt ids the engine saw, the ids it sampled and their logprobs (same length)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    version: int = 0  # the policy version of the weights that sampled completion_ids (uni_agent.online)

    def __post_init__(self) -> None:
        if len(self.completion_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.completion_ids)} completion ids but {len(self.logprobs)} logprobs")


class LLMError(RuntimeError):
    """The endpoint failed for good (after retries) or answered something unusable."""


class TransientLLMError(LLMError):
    """Worth retrying: 429/5xx, a timeout, a dropped connection, a garbled or empty answer."""


class EndpointDownError(TransientLLMError):
    """Nothing accepts connections at the endpoint: its server is down (or not up yet)."""


class ContextLimitError(LLMError):
    """The conversation no longer fits the model's context window."""


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
    token_source: str = ""  # the token-capture protocol asked for (tokens.TOKEN_CAPTURE), "" when none
    # llama_server: the text exactly as sampled, before the server's chat parsing (which trims whitespace and code
    # fences from `content`); kept in the conversation, the next prompt then continues what the model produced
    raw_text: str | None = None
    context: TokenContext | None = None  # what the rollout's next call continues (llama_server token-in)


@dataclass
class TokenContext:
    """The ids of a rollout's last call (prompt + sampled) and the text they render, for the next call to extend."""

    ids: list[int]
    text: str


@dataclass
class HttpAnswer:
    """An HTTP answer read in full (the part of the response the client looks at)."""

    status_code: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return loads_json(self.body)


def answer_json(response: HttpAnswer, latency: float, where: str) -> dict[str, Any]:
    try:
        data = response.json()
    except ValueError as exc:
        raise TransientLLMError(f"{where}: malformed answer ({exc!r}): {response.text[:300]}") from exc
    if not isinstance(data, dict):
        raise TransientLLMError(f"{where}: malformed answer: {response.text[:300]}")
    return data
