"""The driver's actor pool, plus what the service keeps in step across its agent workers: the policy version (and
served model name) of each engine replica. A worker started later (a replacement for a lost one) gets the current
versions before its first rollout, so no token is stamped with a version that no longer serves. Every call to an agent
worker ends when its worker leaves the cluster (driver/worker_watch.py, through ActorPool), so neither a broadcast nor
a rollout waits on a dead one."""

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
        self.switching: set[str] = set()  # URLs whose weights are switching now (weights.switch_replica)

    async def start_actor(self, worker: str, timeout: float = ACTOR_START_TIMEOUT) -> PooledActor:
        actor = await super().start_actor(worker, timeout)  # its handle's calls end if the worker leaves
        paused = []
        for url, version in self.versions.items():
            if url in self.switching:  # a worker started mid-switch (a replacement) holds its calls like the others
                await actor.handle.pause_replica(url, 0.0)
                paused.append(url)
            else:
                await actor.handle.resume_replica(url, version, self.models[url])
        for url in paused:  # the switch ended while this worker was told: its resume may have come before the pause
            if url not in self.switching:
                await actor.handle.resume_replica(url, self.versions[url], self.models[url])
        return actor

    def handles(self) -> list[Any]:
        return [a.handle for a in self.actors.values()]

    def served(self, url: str, version: int, model: str | None) -> None:
        self.versions[url], self.models[url] = version, model
        self.switching.discard(url)

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
