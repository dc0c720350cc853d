"""Finished rows in the shapes trainers take, without importing a trainer (numpy only).

A row's training sequence (uni_agent.episode.trajectory) is one list of token ids with, position by position, a loss
mask (1 on sampled tokens that may be trained on), the logprob the engine reported for each sampled token (0.0
elsewhere, NaN where the engine reported none) and, in rows written by the online service, the policy version that
sampled each token (-1 on tokens nobody sampled: the prompt, tool output, chat-template glue).

The split a trainer wants is prompt | response, cut at the FIRST SAMPLED token: everything before it is the prompt the
model was given, everything from it on is the response (the model's turns, and between them the observations, which
keep response_mask 0). "Sampled" is read from `token_versions` (>= 0) when the row has it, else from `loss_mask`:
a masked rollout (mask_abnormal_exit_traj, staleness, a token drift) has loss_mask 0 on tokens that were sampled,
so only the version column finds its split; without it such a row has no response and is refused (or dropped).

verl_agent_loop_outputs(rows) -> one dict per row, the fields of verl's AgentLoopOutput:
    prompt_ids          list[int]    input_ids before the first sampled token
    response_ids        list[int]    input_ids from the first sampled token to the end
    response_mask       list[int]    loss_mask over response_ids: 1 on trained sampled tokens, 0 on observations
                                     and on sampled tokens the row masks
    response_logprobs   list[float]  the engine's logprob of each response token (0.0 on observations, NaN where the
                                     engine reported none), aligned with response_ids
    reward_score        float        the row's reward (verification's, 0.0 or 1.0 for the bundled graders)
    num_turns           int          messages after the system prompt (user, assistant and tool), verl's count; the
                                     row's own num_turns (model calls) is in extra_fields
    extra_fields        dict         instance_id, rollout, agent_turns, masked, and where present step,
                                     policy_version, version_min, version_max, response_versions (aligned with
                                     response_ids, -1 where not sampled)

padded_batch(rows, pad_id) -> dict of numpy arrays, the layout verl's agent loop hands its trainer (B rows):
    prompts             (B, P) int64    prompt ids, LEFT-padded with pad_id to P (the longest prompt, or max_prompt)
    responses           (B, R) int64    response ids, RIGHT-padded with pad_id to R
    response_mask       (B, R) int64    response_mask, 0 on padding
    input_ids           (B, P+R) int64  prompts then responses
    attention_mask      (B, P+R) int64  1 on real tokens, 0 on padding
    position_ids        (B, P+R) int64  0, 1, 2, ... over the real tokens (padding before them stays 0)
    rollout_log_probs   (B, R) float32  response_logprobs, 0.0 on padding (NaN kept where the engine gave none)
    token_versions      (B, R) int64    the version that sampled each response token, -1 elsewhere and on padding
    reward_scores       (B,) float32    reward_score
    num_turns           (B,) int64      num_turns
A row longer than max_prompt / max_response is an error naming it (cutting tokens would train on a sequence the model
never saw).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

VERSION_FIELDS = ("step", "policy_version", "version_min", "version_max")


class RowFormatError(ValueError):
    """A row cannot become a training example (no tokens, no sampled token, lists of different lengths, too long)."""


def verl_agent_loop_outputs(rows: Any, *, drop_unusable: bool = False) -> list[dict[str, Any]]:
    """One AgentLoopOutput-shaped dict per row (see the module doc). `rows`: a DataFrame of result rows, dicts, or
    RolloutResults. A row without tokens or without a sampled token is a RowFormatError naming it, or left out with
    drop_unusable=True."""
    outputs = []
    for row in _rows(rows):
        try:
            outputs.append(_agent_loop_output(row))
        except RowFormatError:
            if not drop_unusable:
                raise
    return outputs


def padded_batch(rows: Any, pad_id: int, *, max_prompt: int | None = None, max_response: int | None = None,
                 drop_unusable: bool = False) -> dict[str, np.ndarray]:
    """The rows as one padded batch of numpy arrays (see the module doc)."""
    outputs = verl_agent_loop_outputs(rows, drop_unusable=drop_unusable)
    if not outputs:
        raise RowFormatError("no rows to batch")
    for out in outputs:
        for field, limit in (("prompt_ids", max_prompt), ("response_ids", max_response)):
            if limit is not None and len(out[field]) > limit:
                raise RowFormatError(f"{_name(out['extra_fields'])}: {len(out[field])} {field}, more than {limit}")
    p = max_prompt or max(len(o["prompt_ids"]) for o in outputs)
    r = max_response or max(len(o["response_ids"]) for o in outputs)
    b = len(outputs)
    prompts = np.full((b, p), pad_id, dtype=np.int64)
    responses = np.full((b, r), pad_id, dtype=np.int64)
    response_mask = np.zeros((b, r), dtype=np.int64)
    logprobs = np.zeros((b, r), dtype=np.float32)
    versions = np.full((b, r), -1, dtype=np.int64)
    attention = np.zeros((b, p + r), dtype=np.int64)
    for i, out in enumerate(outputs):
        n_prompt, n_response = len(out["prompt_ids"]), len(out["response_ids"])
        prompts[i, p - n_prompt:] = out["prompt_ids"]
        responses[i, :n_response] = out["response_ids"]
        response_mask[i, :n_response] = out["response_mask"]
        logprobs[i, :n_response] = out["response_logprobs"]
        if "response_versions" in out["extra_fields"]:
            versions[i, :n_response] = out["extra_fields"]["response_versions"]
        attention[i, p - n_prompt:p + n_response] = 1
    return {
        "prompts": prompts, "responses": responses, "response_mask": response_mask,
        "input_ids": np.concatenate([prompts, responses], axis=1), "attention_mask": attention,
        "position_ids": np.clip(np.cumsum(attention, axis=1) - 1, 0, None),
        "rollout_log_probs": logprobs, "token_versions": versions,
        "reward_scores": np.array([o["reward_score"] for o in outputs], dtype=np.float32),
        "num_turns": np.array([o["num_turns"] for o in outputs], dtype=np.int64),
    }


def _agent_loop_output(row: Mapping[str, Any]) -> dict[str, Any]:
    name = _name(row)
    ids, mask, logprobs = (_list(row.get(c)) for c in ("input_ids", "loss_mask", "logprobs"))
    versions = _list(row.get("token_versions"))
    if not ids:
        raise RowFormatError(f"{name}: no token ids ({row.get('tokens_missing') or 'token capture was off'})")
    lengths = {"input_ids": len(ids), "loss_mask": len(mask), "logprobs": len(logprobs)}
    if versions:
        lengths["token_versions"] = len(versions)
    if len(set(lengths.values())) != 1:
        raise RowFormatError(f"{name}: token lists of different lengths {lengths}")
    sampled = [v >= 0 for v in versions] if versions else [m == 1 for m in mask]
    if not any(sampled):
        raise RowFormatError(f"{name}: no sampled token to start a response at "
                             + ("(the row is masked and has no token_versions)" if versions == [] else ""))
    first = sampled.index(True)
    extra: dict[str, Any] = {"instance_id": row.get("instance_id"), "rollout": _int(row.get("rollout")),
                             "agent_turns": _int(row.get("num_turns")), "masked": bool(row.get("masked") or False)}
    extra.update({f: _int(row[f]) for f in VERSION_FIELDS if row.get(f) is not None})
    if versions:
        extra["response_versions"] = [int(v) for v in versions[first:]]
    return {
        "prompt_ids": [int(t) for t in ids[:first]],
        "response_ids": [int(t) for t in ids[first:]],
        "response_mask": [int(m) for m in mask[first:]],
        "response_logprobs": [float(x) for x in logprobs[first:]],
        "reward_score": float(row.get("reward") or 0.0),
        "num_turns": _message_turns(row),
        "extra_fields": extra,
    }


def _message_turns(row: Mapping[str, Any]) -> int:
    messages = row.get("messages")
    if isinstance(messages, str):
        try:
            messages = json.loads(messages)
        except ValueError:
            messages = None
    if isinstance(messages, list) and messages:
        return sum(1 for m in messages if isinstance(m, dict) and m.get("role") != "system")
    return _int(row.get("num_turns"))


def _rows(rows: Any) -> Iterable[Mapping[str, Any]]:
    if hasattr(rows, "to_dict") and hasattr(rows, "columns"):  # a pandas DataFrame
        return rows.to_dict("records")
    return [r.row() if hasattr(r, "row") else r for r in rows]


def _list(value: Any) -> list[Any]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return list(value)


def _int(value: Any) -> int:
    return int(value) if value is not None else 0


def _name(row: Mapping[str, Any]) -> str:
    return f"row {row.get('instance_id')!s} rollout {row.get('rollout')!s}"
