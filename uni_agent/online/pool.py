"""The driver's actor pool, plus what the service keeps in step across its agent workers: the policy version (and
served model name) of each engine replica. A worker started later (a replacement for a lost one) gets the current
versions before its first rollout, so no token is stamped with a version that no longer serves."""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from ..driver.pool import ActorPool, PooledActor
from ..driver.policy import ACTOR_START_TIMEOUT

log = structlog.get_logger("uni_agent.online")


class VersionedPool(ActorPool):
    def __init__(self, client: Any, engines: Any, settings: Any, log_dir: Any, versions: dict[str, int]):
        super().__init__(client, engines, settings, log_dir)
        self.versions = dict(versions)  # engine URL -> the policy version it serves
        self.models: dict[str, str | None] = dict.fromkeys(versions)  # URL -> served model name (None: unchanged)

    async def start_actor(self, worker: str, timeout: float = ACTOR_START_TIMEOUT) -> PooledActor:
        actor = await super().start_actor(worker, timeout)
        for url, version in self.versions.items():
            await actor.handle.resume_replica(url, version, self.models[url])
        return actor

    def handles(self) -> list[Any]:
        return [a.handle for a in self.actors.values()]

    def served(self, url: str, version: int, model: str | None) -> None:
        self.versions[url], self.models[url] = version, model

    async def broadcast(self, method: str, *args: Any) -> list[Any]:
        """`method` on every agent worker at once; a worker that is gone answers None (the dispatcher replaces it,
        and its replacement starts with the current versions): an update never waits on a dead worker."""
        async def one(handle: Any) -> Any:
            try:
                return await getattr(handle, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a lost worker's rollouts are retried by the dispatcher
                log.warning("agent_worker_unreachable", method=method, error=f"{type(exc).__name__}: {exc}")
                return None
        return list(await asyncio.gather(*(one(h) for h in self.handles())))

    async def replica_load(self) -> dict[str, dict[str, Any]]:
        """Per engine URL, summed over the agent workers: rollouts on it, calls in flight and made, paused, version."""
        load: dict[str, dict[str, Any]] = {url: {"rollouts": 0, "calls": 0, "calls_done": 0, "paused": False,
                                                 "version": v} for url, v in self.versions.items()}
        for answer in await self.broadcast("replica_load"):
            for url, entry in (answer or {}).items():
                mine = load.setdefault(url, {"rollouts": 0, "calls": 0, "calls_done": 0, "paused": False,
                                             "version": None})
                for field in ("rollouts", "calls", "calls_done"):
                    mine[field] += entry[field]
                mine["paused"] = mine["paused"] or entry["paused"]
        return load
