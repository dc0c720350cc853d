"""Group-relative policy-gradient math (GRPO), on torch tensors: advantages, token logprobs, the clipped loss.

    advantages = group_advantages(group.rewards)              # per rollout, relative to its task's other rollouts
    logprobs = token_logprobs(model, ids, attention)           # log p(token_t | tokens before t), aligned with ids
    loss, stats = clipped_policy_loss(logprobs, old, advantages, loss_mask, sampler_logprobs=...)

The objective per sampled token t of rollout i (loss_mask 1):

    ratio_t = exp(logp_theta(t) - logp_old(t))              logp_old: the trainer's own recomputed logprobs of the
                                                            weights it exported (before this step's updates)
    term_t  = min(ratio_t * A_i, clip(ratio_t, 1-eps_low, 1+eps_high) * A_i) * w_t
    w_t     = min(exp(logp_old(t) - logp_sampler(t)), tis_cap)   truncated importance weight: the engine sampled
                                                            with other numerics (F16 GGUF) or, asynchronously, an
                                                            older version; 1 where the engine gave no logprob
    loss    = -sum(term_t) / number of trained tokens in the batch (every token weighs the same)

A_i = (r_i - mean(r of the group)) / (std(r of the group) + 1e-6); a group whose rewards are all equal gives 0
(nothing to learn from it). Pure functions: the trainer (uni_agent.training.trainer) does the batching.
"""

from __future__ import annotations

import math
import statistics
from typing import Any


def group_advantages(rewards: list[float], *, scale: bool = True) -> list[float]:
    """Each reward minus its group's mean, divided by the group's standard deviation (population) when `scale`."""
    if not rewards:
        return []
    mean = statistics.fmean(rewards)
    std = statistics.pstdev(rewards) if scale else 1.0
    return [(r - mean) / (std + 1e-6) if scale else r - mean for r in rewards]


def token_logprobs(model: Any, input_ids: Any, attention_mask: Any) -> Any:
    """(B, T) log-probabilities of each token given the tokens before it; position 0 (no context) is 0."""
    import torch
    import torch.nn.functional as F

    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    targets = input_ids[:, 1:]
    picked = -F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                              reduction="none").view(targets.shape)
    return torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)


def clipped_policy_loss(logprobs: Any, old_logprobs: Any, advantages: Any, loss_mask: Any, *,
                        sampler_logprobs: Any | None = None, clip_low: float = 0.2, clip_high: float = 0.28,
                        tis_cap: float | None = 2.0, token_count: float | None = None) -> tuple[Any, dict[str, float]]:
    """The loss above over (B, T) tensors; `advantages` is (B,), `loss_mask` (B, T) of 0/1. `token_count`: the
    denominator (the whole batch's trained tokens, when this is one micro-batch of it). Returns (loss, stats)."""
    import torch

    mask = loss_mask.to(logprobs.dtype)
    denominator = token_count if token_count is not None else float(mask.sum().clamp(min=1.0))
    ratio = torch.exp(logprobs - old_logprobs)
    adv = advantages.to(logprobs.dtype)[:, None]
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    term = torch.minimum(unclipped, clipped)
    weight = torch.ones_like(logprobs)
    if sampler_logprobs is not None and tis_cap is not None:
        known = torch.isfinite(sampler_logprobs)
        gap = torch.where(known, old_logprobs - torch.nan_to_num(sampler_logprobs), torch.zeros_like(logprobs))
        weight = torch.clamp(torch.exp(gap), max=tis_cap).detach()
    loss = -(term * weight * mask).sum() / denominator
    with torch.no_grad():
        trained = mask.sum().clamp(min=1.0)
        stats = {
            "clip_fraction": float(((unclipped != clipped) & (mask > 0)).sum() / trained),
            "ratio_mean": float((ratio * mask).sum() / trained),
            "tis_weight_mean": float((weight * mask).sum() / trained),
        }
    return loss, stats


def logprob_gap(sampler_logprobs: Any, trainer_logprobs: Any, mask: Any) -> dict[str, float]:
    """How far the engine's logprobs of the sampled tokens are from the trainer's, over the tokens `mask` selects
    that the engine reported: mean |difference|, mean difference (sampler - trainer) and the k3 estimate of
    KL(sampler || trainer) per token."""
    import torch

    known = torch.isfinite(sampler_logprobs) & (mask > 0)
    count = int(known.sum())
    if count == 0:
        return {"tokens": 0, "abs_mean": math.nan, "mean": math.nan, "kl_k3": math.nan}
    diff = (sampler_logprobs[known] - trainer_logprobs[known]).double()
    log_ratio = -diff  # log(p_trainer / p_sampler) at the sampled token
    return {"tokens": count, "abs_mean": float(diff.abs().mean()), "mean": float(diff.mean()),
            "kl_k3": float((torch.exp(log_ratio) - 1 - log_ratio).mean())}
