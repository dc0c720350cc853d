"""Online rollouts for trainers: a long-lived service over the cluster that a trainer calls step after step.

    service     RolloutService: submit rows x n for a policy version, results and groups as they finish, cancel,
                stats, update_weights, close
    batch       RolloutBatch (one submit) and Group (the n rollouts of one row)
    pool        the driver's actor pool, keeping each engine replica's policy version on every agent worker
    weights     update_weights per engine: llama.cpp rolling restart, vLLM runtime endpoints, external model names
    staleness   max_staleness: how old a finished rollout's tokens may be, and masking or restarting past that

`from uni_agent.online import RolloutService` loads the service (and Dask) on first use only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RolloutService", "UpdateFailed"]


def __getattr__(name: str) -> Any:
    if name == "RolloutService":
        from .service import RolloutService

        return RolloutService
    if name == "UpdateFailed":
        from .weights import UpdateFailed

        return UpdateFailed
    raise AttributeError(name)
