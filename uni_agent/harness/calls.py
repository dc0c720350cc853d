"""What a harness rollout's model calls leave in its row: the messages as the program sent them, the replies, and the
token columns, split into chains where the program rewrote its history.

A program that brings its own loop sends its whole conversation with every call. While each call's messages extend
the previous call's messages plus the reply it got, the calls form one chain: the next call continues the previous
call's exact ids (llama-server token-in, uni_agent.llm.tokens) and the chain is one training sequence, built as for our
own loop (uni_agent.episode.trajectory, token_drift included). When the messages do not extend them (the program
truncated or summarised its history), the sequence cannot continue: a new chain starts, from a fresh tokenization of
the new conversation, and the row's `chains` column says where (call, token and message offsets) and why. The row's
`input_ids`/`loss_mask`/`logprobs` are the chains one after another; `messages` is each chain's last conversation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..episode.trajectory import TurnTokens, build_sequence, set_token_versions
from ..llm import ChatReply, TokenContext

if TYPE_CHECKING:
    from ..episode.rollout import RolloutResult


@dataclass
class Chain:
    first_call: int
    reason: str
    turns: list[TurnTokens] = field(default_factory=list)
    calls: int = 0
    conversation: list[dict[str, Any]] = field(default_factory=list)  # its last call's messages and reply
    context: TokenContext | None = None  # what its next call continues (llama_server token-in)


class CallLog:
    """One harness rollout's model calls, in the order the gateway answered them."""

    def __init__(self) -> None:
        self.chains: list[Chain] = []
        self.calls = 0
        self.missing: str | None = None  # the first call that came back without tokens, and why
        self.source = ""
        self.prompt_tokens = self.completion_tokens = 0
        self.llm_s = 0.0

    def continuation(self, messages: list[dict[str, Any]]) -> tuple[TokenContext | None, str | None]:
        """The context the next call continues, or None and why a new chain starts."""
        if not self.chains:
            return None, "first call"
        chain = self.chains[-1]
        before = chain.conversation
        for index, (old, new) in enumerate(zip(before, messages)):
            if _comparable(old) != _comparable(new):
                return None, f"history rewritten: message {index} ({new.get('role')}) differs from the previous call's"
        if len(messages) <= len(before):
            return None, (f"history cut: {len(messages)} messages, the previous call's conversation had "
                          f"{len(before)} with its reply")
        return chain.context, None

    def add(self, messages: list[dict[str, Any]], answer: dict[str, Any], reply: ChatReply,
            new_chain: str | None) -> None:
        """Record one answered call: the program's messages, the assistant message it got, the engine's reply."""
        self.calls += 1
        if new_chain is not None or not self.chains:
            self.chains.append(Chain(self.calls, new_chain or "first call"))
        chain = self.chains[-1]
        chain.calls += 1
        chain.conversation = [*messages, answer]
        chain.context = reply.context
        self.prompt_tokens += reply.prompt_tokens
        self.completion_tokens += reply.completion_tokens
        self.llm_s += reply.latency_s
        self.source = reply.token_source
        if reply.tokens is not None:
            chain.turns.append(reply.tokens)
        elif reply.token_source and self.missing is None:
            self.missing = f"call {self.calls}: {reply.tokens_missing}"

    def fill(self, result: RolloutResult) -> None:
        """The row's messages, chains and token columns."""
        messages: list[dict[str, Any]] = []
        described = []
        ids: list[int] = []
        mask: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        drift = None
        for number, chain in enumerate(self.chains):
            start = len(ids)
            if self.missing is None and chain.turns:
                sequence = build_sequence(chain.turns)
                ids += sequence.input_ids
                mask += sequence.loss_mask
                logprobs += sequence.logprobs
                versions += sequence.versions
                if sequence.drift and drift is None:
                    drift = {**sequence.drift, "chain": number}
            described.append({"chain": number, "first_call": chain.first_call, "calls": chain.calls,
                              "token_start": start, "token_end": len(ids), "message_start": len(messages),
                              "reason": chain.reason})
            messages += chain.conversation
        result.messages = messages
        result.chains = described
        result.num_turns = self.calls
        result.prompt_tokens, result.completion_tokens, result.llm_s = (
            self.prompt_tokens, self.completion_tokens, self.llm_s)
        result.token_source = self.source
        if self.missing is not None:
            result.tokens_missing = self.missing
        else:
            result.input_ids, result.loss_mask, result.logprobs = ids, mask, logprobs
            set_token_versions(result, versions)  # the online service's staleness bound reads them, as for our loop
            result.token_drift = drift


def _comparable(message: dict[str, Any]) -> tuple[Any, ...]:
    """What must stay the same for a message to count as unchanged: role, text, tool calls, the call it answers.
    Fields a client adds or drops on its way back (null content, an empty tool list, extra keys) do not count."""
    calls = tuple((c.get("id"), (c.get("function") or {}).get("name"), _arguments((c.get("function") or {})))
                  for c in message.get("tool_calls") or [])
    return message.get("role"), _text(message.get("content")), calls, message.get("tool_call_id")


def _text(content: Any) -> str:
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _arguments(function: dict[str, Any]) -> Any:
    raw = function.get("arguments")
    if isinstance(raw, str):
        try:
            return json.dumps(json.loads(raw), sort_keys=True)
        except ValueError:
            return raw
    return json.dumps(raw, sort_keys=True)
