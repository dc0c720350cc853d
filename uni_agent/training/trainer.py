"""One GRPO training step over the rollout service's rows: rows in, updated weights and the step's figures out.

    trainer = GRPOTrainer(model, TrainConfig(lr=2e-5), device="cuda")
    examples = examples_from_groups(groups)        # the groups of a batch (RolloutBatch.groups()): advantages per group
    stats = trainer.step(examples)                 # then export_gguf(...) and service.update_weights(...)

A row's training sequence is its `input_ids` (prompt, the model's turns and the observations between them, as the
engine saw them), its `loss_mask` (1 on the sampled tokens to train: 0 on prompt, observations and masked rows)
and its `logprobs` (the engine's, of each sampled token). The step first recomputes the logprobs of every sequence
under the trainer's current weights (the weights it exported as the version that is serving: the "old" policy of
the clipped ratio), measures how far the engine's logprobs are from them (the off-policy error), then makes
`minibatches` optimizer steps per epoch over the rollouts whose advantage is not 0 (uni_agent.training.grpo).
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

from .grpo import clipped_policy_loss, group_advantages, logprob_gap, token_logprobs


@dataclass
class TrainConfig:
    lr: float = 1e-5
    epochs: int = 1
    minibatches: int = 2  # optimizer steps per epoch
    micro_tokens: int = 16384  # padded tokens per forward pass (gradient accumulation inside a minibatch)
    clip_low: float = 0.2
    clip_high: float = 0.28
    tis_cap: float | None = 2.0  # truncated importance weight (trainer vs engine); None: off
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    scale_advantages: bool = True  # divide by the group's standard deviation
    seed: int = 0


@dataclass
class Example:
    """One rollout as the trainer takes it."""

    input_ids: list[int]
    loss_mask: list[int]
    sampler_logprobs: list[float]  # NaN where the engine reported none
    advantage: float
    reward: float
    versions: list[int] = field(default_factory=list)

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


def examples_from_groups(groups: list[Any], *, scale: bool = True) -> list[Example]:
    """Examples from the service's groups (`.results`, rows with tokens); a row without tokens is left out."""
    examples = []
    for group in groups:
        rows = [r for r in group.results if len(r.input_ids or []) > 1]
        for row, advantage in zip(rows, group_advantages([r.reward for r in rows], scale=scale), strict=True):
            logprobs = [math.nan if lp is None else float(lp) for lp in row.logprobs]
            examples.append(Example(list(row.input_ids), [int(m) for m in row.loss_mask], logprobs, advantage,
                                    float(row.reward), [int(v) for v in (row.token_versions or [])]))
    return examples


class GRPOTrainer:
    def __init__(self, model: Any, config: TrainConfig | None = None, device: str = "cpu"):
        import torch

        self.model, self.config, self.device = model, config or TrainConfig(), device
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=self.config.lr,
                                           weight_decay=self.config.weight_decay)
        self.rng = random.Random(self.config.seed)
        self.steps = 0

    def step(self, examples: list[Example], version: int | None = None) -> dict[str, Any]:
        """Recompute the old logprobs, measure the sampler gap, update; returns the step's figures. `version`: the
        policy version the trainer's weights are (the one serving): the gap is then also split into the tokens that
        version sampled (numerics alone: F16 GGUF against F32) and those older versions sampled (asynchronous
        rows: numerics plus the policy's own change)."""
        import torch

        started = time.monotonic()
        cfg = self.config
        self.model.eval()
        old = self._logprobs(examples)  # per example, on the CPU: the ratio's reference and the gap's
        recomputed = time.monotonic()
        gap = self._gap(examples, old)
        if version is not None:
            gap["current_version"] = self._gap(examples, old, lambda v: v == version)
            gap["older_versions"] = self._gap(examples, old, lambda v: 0 <= v < version)
        learn = [i for i, e in enumerate(examples) if e.advantage != 0 and e.trained_tokens > 0]
        losses, clip_fractions, ratios, weights, norms = [], [], [], [], []
        self.model.train()
        for _ in range(cfg.epochs if learn else 0):
            order = learn[:]
            self.rng.shuffle(order)
            size = math.ceil(len(order) / max(1, min(cfg.minibatches, len(order))))
            for start in range(0, len(order), size):
                chosen = order[start:start + size]
                token_count = float(sum(examples[i].trained_tokens for i in chosen))
                self.optimizer.zero_grad(set_to_none=True)
                total = 0.0
                for micro in self._micro_batches([examples[i] for i in chosen], chosen):
                    ids, attention, mask, sampler, adv, index = micro
                    logprobs = token_logprobs(self.model, ids, attention)
                    old_lp = self._padded([old[i] for i in index], ids.shape[1])
                    loss, stats = clipped_policy_loss(
                        logprobs, old_lp, adv, mask, sampler_logprobs=sampler, clip_low=cfg.clip_low,
                        clip_high=cfg.clip_high, tis_cap=cfg.tis_cap, token_count=token_count)
                    loss.backward()
                    total += float(loss.detach())
                    clip_fractions.append(stats["clip_fraction"])
                    ratios.append(stats["ratio_mean"])
                    weights.append(stats["tis_weight_mean"])
                norms.append(float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)))
                self.optimizer.step()
                losses.append(total)
        self.steps += 1
        self.model.eval()
        return {
            "examples": len(examples), "learned_from": len(learn),
            "trained_tokens": sum(examples[i].trained_tokens for i in learn),
            "loss": _mean(losses), "clip_fraction": _mean(clip_fractions), "ratio_mean": _mean(ratios),
            "tis_weight_mean": _mean(weights), "grad_norm": _mean(norms), "optimizer_steps": len(norms),
            "gap": gap, "recompute_s": round(recomputed - started, 3),
            "update_s": round(time.monotonic() - recomputed, 3), "train_s": round(time.monotonic() - started, 3),
        }

    # -- batching ----------------------------------------------------------------------------------------------------

    def _logprobs(self, examples: list[Example]) -> list[Any]:
        import torch

        out: list[Any] = [None] * len(examples)
        with torch.no_grad():
            for ids, attention, _mask, _sampler, _adv, index in self._micro_batches(examples, range(len(examples))):
                logprobs = token_logprobs(self.model, ids, attention).float().cpu()
                for row, i in enumerate(index):
                    out[i] = logprobs[row, :int(attention[row].sum())]
        return out

    def _gap(self, examples: list[Example], old: list[Any], chosen: Any = None) -> dict[str, Any]:
        """The sampler-vs-trainer gap over the sampled tokens (those whose version `chosen` accepts, when given)."""
        import torch

        sampler = torch.cat([torch.tensor(e.sampler_logprobs, dtype=torch.float32) for e in examples]) \
            if examples else torch.zeros(0)
        sampled = torch.cat([torch.tensor(_sampled(e, chosen), dtype=torch.float32) for e in examples]) \
            if examples else torch.zeros(0)
        trainer = torch.cat(old) if old else torch.zeros(0)
        return logprob_gap(sampler, trainer, sampled)

    def _micro_batches(self, examples: list[Example], index: Any):
        """Micro-batches of right-padded tensors on the device, longest first, each at most micro_tokens padded
        tokens (one sequence alone when it is longer)."""
        import torch

        pairs = sorted(zip(index, examples, strict=True), key=lambda p: -len(p[1].input_ids))
        batch: list[tuple[int, Example]] = []
        for pair in pairs:
            width = len(batch[0][1].input_ids) if batch else len(pair[1].input_ids)
            if batch and width * (len(batch) + 1) > self.config.micro_tokens:
                yield self._tensors(batch, torch)
                batch = []
            batch.append(pair)
        if batch:
            yield self._tensors(batch, torch)

    def _tensors(self, batch: list[tuple[int, Example]], torch: Any) -> tuple[Any, ...]:
        width = max(len(e.input_ids) for _, e in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        attention = torch.zeros_like(ids)
        mask = torch.zeros((len(batch), width), dtype=torch.float32)
        sampler = torch.full((len(batch), width), math.nan, dtype=torch.float32)
        for row, (_, e) in enumerate(batch):
            n = len(e.input_ids)
            ids[row, :n] = torch.tensor(e.input_ids)
            attention[row, :n] = 1
            mask[row, :n] = torch.tensor(e.loss_mask, dtype=torch.float32)
            sampler[row, :n] = torch.tensor(e.sampler_logprobs, dtype=torch.float32)
        adv = torch.tensor([e.advantage for _, e in batch], dtype=torch.float32)
        d = self.device
        return ids.to(d), attention.to(d), mask.to(d), sampler.to(d), adv.to(d), [i for i, _ in batch]

    def _padded(self, rows: list[Any], width: int) -> Any:
        import torch

        out = torch.zeros((len(rows), width), dtype=torch.float32)
        for r, lp in enumerate(rows):
            out[r, :len(lp)] = lp
        return out.to(self.device)


def _sampled(example: Example, chosen: Any = None) -> list[int]:
    """1 on the tokens a model sampled (of a version `chosen` accepts): from the versions where the row has them
    (a masked row's loss mask is 0 on its sampled tokens too), else from the loss mask."""
    if len(example.versions) == len(example.input_ids):
        return [1 if v >= 0 and (chosen is None or chosen(v)) else 0 for v in example.versions]
    return list(example.loss_mask) if chosen is None else [0] * len(example.loss_mask)


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 6) if values else 0.0
