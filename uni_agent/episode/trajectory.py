"""One training sequence per rollout, built from the tokens of its model calls as the engine reported them.

Each call k gives the prompt ids P_k the engine saw and the completion ids C_k it sampled (with their logprobs). The
sequence starts as P_1 + C_1; call k+1 continues it when P_{k+1} begins with the sequence so far, and only the new
tail of P_{k+1} (the tool output, the next user message, the chat template's glue) is appended, then C_{k+1}.
`loss_mask` is 1 on sampled tokens and 0 on everything else; `logprobs` holds each sampled token's logprob (NaN where
the engine reported none) and 0.0 elsewhere, so the three lists always have the same length.

When P_{k+1} does not begin with the sequence so far (a re-rendered message tokenizes differently, a template drops
text, an observation was changed after the model saw it), re-tokenizing the messages would silently train on
tokens the model never produced. Instead the drift is recorded (call, position) and the sequence is cut back to
the common prefix, continued with the rest of P_{k+1} exactly as the engine saw it, and every token from there on
gets loss_mask 0: nothing after a drift is trained on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..llm.reply import TurnTokens

if TYPE_CHECKING:
    from .rollout import RolloutResult


@dataclass
class Sequence:
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # the policy version that sampled each token, -1 if none did
    drift: dict | None = None  # {"turn": k, "position": i, "expected": id | None, "got": id | None}


def build_sequence(turns: list[TurnTokens]) -> Sequence:
    seq = Sequence()
    for number, turn in enumerate(turns, start=1):
        prompt = turn.prompt_ids
        start = len(seq.input_ids)
        if prompt[:start] != seq.input_ids:
            position = _first_difference(seq.input_ids, prompt)
            if seq.drift is None:
                seq.drift = {"turn": number, "position": position,
                             "expected": seq.input_ids[position] if position < start else None,
                             "got": prompt[position] if position < len(prompt) else None}
            del seq.input_ids[position:], seq.loss_mask[position:], seq.logprobs[position:], seq.versions[position:]
            start = position
        tail = prompt[start:]
        seq.input_ids += tail
        seq.loss_mask += [0] * len(tail)
        seq.logprobs += [0.0] * len(tail)
        seq.versions += [-1] * len(tail)
        trained = 0 if seq.drift else 1
        seq.input_ids += turn.completion_ids
        seq.loss_mask += [trained] * len(turn.completion_ids)
        seq.logprobs += list(turn.logprobs)
        seq.versions += [turn.version] * len(turn.completion_ids)
    return seq


class TokenLog:
    """One rollout's model calls' tokens, as they come. A rollout some of whose calls came back without tokens gets
    none: a sequence with a hole would not be what the model saw."""

    def __init__(self) -> None:
        self.turns: list[TurnTokens] = []
        self.missing: str | None = None  # the first call that came back without tokens, and why
        self.source = ""  # the token-capture protocol the calls asked for (llm.TOKEN_CAPTURE), "" for none

    def add(self, turn: int, tokens: TurnTokens | None, source: str, missing: str | None) -> None:
        self.source = source
        if tokens is not None:
            self.turns.append(tokens)
        elif source and self.missing is None:
            self.missing = f"turn {turn}: {missing}"

    def fill(self, result: RolloutResult) -> None:
        """The row's token columns: the training sequence, or why there is none."""
        result.token_source = self.source
        if self.missing is not None:
            result.tokens_missing = self.missing
        elif self.turns:
            seq = build_sequence(self.turns)
            result.input_ids, result.loss_mask, result.logprobs = seq.input_ids, seq.loss_mask, seq.logprobs
            result.token_drift = seq.drift
            set_token_versions(result, seq.versions)


def set_token_versions(result: RolloutResult, versions: list[int]) -> None:
    """The row's policy version per token (-1: not sampled) and the range of those that sampled it."""
    result.token_versions = versions
    sampled = [v for v in versions if v >= 0]
    if sampled:
        result.version_min, result.version_max = min(sampled), max(sampled)


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def capture_note(mode: str | None, engine: str, results: Any = None) -> str | None:
    """The one line a run prints about token capture: before the run when it is off, after it when some rollouts
    came back without tokens (with the first reason; the row's tokens_missing has each one)."""
    if mode is None:
        return (f"token capture is off (engine {engine}): input_ids, loss_mask and logprobs stay empty; an external "
                "vLLM or llama.cpp server can fill them with --token-capture vllm|llama_server")
    if results is None or not len(results) or "tokens_missing" not in results:
        return None
    missing = results["tokens_missing"].dropna()
    if missing.empty:
        return None
    return (f"token capture ({mode}): {len(missing)} of {len(results)} rollouts have no token ids; first reason: "
            f"{missing.iloc[0]}")
