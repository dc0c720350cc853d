"""How old a rollout's tokens may be when it finishes (max_staleness), and what happens past that. Pure: no I/O.

A token's staleness is the service's current policy version minus the version that sampled it; a rollout's is that of
its oldest sampled token (version_min). With max_staleness k, a rollout finishing with staleness > k is
    masked      kept, but not trained on: loss_mask all 0, masked=True, mask_reason and staleness_action say why
    restarted   run again from the start on the current weights (at most `max_restarts` times, then masked); the row
                that is recorded is the fresh run, with staleness_action "restarted" and stale_restarts counting
max_staleness None (the default) bounds nothing. A rollout with no sampled token (no token capture) is never stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..episode.rollout import RolloutResult

StaleAction = Literal["mask", "restart"]


@dataclass(frozen=True)
class StalenessBound:
    max_staleness: int | None = None
    action: StaleAction = "mask"
    max_restarts: int = 2

    def __post_init__(self) -> None:
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {self.max_staleness}")
        if self.action not in ("mask", "restart"):
            raise ValueError(f"staleness action must be 'mask' or 'restart', got {self.action!r}")

    def staleness(self, result: RolloutResult, current_version: int) -> int | None:
        """How many versions behind `current_version` the rollout's oldest sampled token is (None: no tokens)."""
        return None if result.version_min < 0 else current_version - result.version_min

    def decide(self, result: RolloutResult, current_version: int, restarts_so_far: int) -> str:
        """keep, mask or restart."""
        staleness = self.staleness(result, current_version)
        if self.max_staleness is None or staleness is None or staleness <= self.max_staleness:
            return "keep"
        if self.action == "restart" and restarts_so_far < self.max_restarts:
            return "restart"
        return "mask"

    def mask(self, result: RolloutResult, current_version: int) -> None:
        """Keep the row but train on none of it, saying why."""
        why = (f"stale: sampled by versions {result.version_min}..{result.version_max}, current version "
               f"{current_version}, max_staleness {self.max_staleness}")
        result.masked, result.loss_mask = True, [0] * len(result.loss_mask)
        result.mask_reason = f"{result.mask_reason}; {why}" if result.mask_reason else why
        result.staleness_action = "masked"
