"""The AgentWorker actors of a run. The pool places each actor on a worker it chooses (`workers=[worker]`) and records
that worker itself, so it never reads Dask's private actor attributes to learn where an actor lives."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from distributed import Client

from ..llm import token_capture_for
from ..settings import RunSettings
from ..episode.worker import AgentWorker
from .cluster import live_workers
from .policy import ACTOR_START_TIMEOUT
from .worker_watch import WatchedActor, WorkerWatch

log = structlog.get_logger("uni_agent.driver")


@dataclass
class PooledActor:
    name: str  # the key of its future, unique in the run
    worker: str  # the worker the pool placed it on
    handle: Any  # the distributed Actor: its methods are the AgentWorker's


class ActorPool:
    """`engines` None: they are still starting; the actors start without them and are told by `engines_ready`."""

    def __init__(self, client: Client, engines: Any, settings: RunSettings, log_dir: Path):
        self.client, self.engines, self.settings, self.log_dir = client, engines, settings, log_dir
        self.actors: dict[str, PooledActor] = {}  # the actors in use; a dropped one leaves
        self.futures: list[Any] = []  # an actor lives only while its future is referenced: kept for the whole run
        self.actors_started: list[str] = []
        self.watch = WorkerWatch(self.live_workers)  # a call to a dead worker's actor ends, never hangs

    async def start_actor(self, worker: str, timeout: float = ACTOR_START_TIMEOUT) -> PooledActor:
        e = self.engines
        urls, model, api_key = (e.urls, e.model_name, e.api_key) if e is not None else ([], "", None)
        name = f"agent-worker-{len(self.actors_started)}-{uuid.uuid4().hex[:8]}"
        self.actors_started.append(name)  # numbered as asked: several may be starting at once
        future = self.client.submit(
            AgentWorker, urls, model, api_key, self.settings.sampling(), self.settings.llm_timeout,
            str(self.log_dir), self.settings.log_level,
            token_capture=token_capture_for(self.settings.token_capture, self.settings.engine),
            down_wait=self.settings.engine_down_wait,
            actor=True, workers=[worker], key=name,
        )
        waiter = asyncio.ensure_future(_awaited(future))
        deadline = time.monotonic() + timeout
        try:
            # Pinned to one worker, the actor never starts if that worker dies first: give up as soon as the
            # scheduler no longer knows it, rather than at the deadline.
            while not (await asyncio.wait({waiter}, timeout=1.0))[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"agent worker did not start on {worker} within {timeout:g} s")
                if worker not in await self.live_workers():
                    raise RuntimeError(f"worker {worker} left before its agent worker started")
            handle = waiter.result()
        except BaseException:
            waiter.cancel()
            with contextlib.suppress(Exception):
                await self.client.cancel([future])
            raise
        self.futures.append(future)
        actor = self.actors[name] = PooledActor(name, worker, WatchedActor(handle, worker, self.watch))
        if e is None and self.engines is not None:  # the engines became ready while it started: it missed the news
            await _told(actor, self.engines)
        return actor

    async def engines_ready(self, engines: Any) -> None:
        """Every actor learns the engines (their rollouts waiting for them begin); an actor started from now on gets
        them when it starts. An actor whose worker is gone is skipped: the dispatcher replaces it."""
        self.engines = engines
        await asyncio.gather(*(_told(actor, engines) for actor in list(self.actors.values())))

    def handle(self, name: str) -> Any:
        return self.actors[name].handle

    def drop(self, name: str) -> PooledActor | None:
        """Stop using an actor (its worker is gone); returns its record."""
        return self.actors.pop(name, None)

    async def live_workers(self) -> set[str]:
        try:
            return await live_workers(self.client)
        except Exception:  # cannot tell: count every actor as alive rather than drop it for a scheduler hiccup
            return {actor.worker for actor in self.actors.values()}

    async def close(self) -> None:
        """Every actor at once: each closes its sandboxes and its engine connections (thousands a worker at 100,000
        in flight), and one after another that took seconds at a large run's end."""
        await asyncio.gather(*(_closed(actor) for actor in self.actors.values()))
        await self.watch.close()


async def _told(actor: PooledActor, engines: Any) -> None:
    try:
        await actor.handle.set_engines(engines.urls, engines.model_name, engines.api_key)
    except Exception as exc:  # its worker left (the dispatcher replaces it); said, in case it is anything else
        log.warning("agent_worker_not_told_engines", actor=actor.name, error=f"{type(exc).__name__}: {exc}")


async def _closed(actor: PooledActor) -> None:
    with contextlib.suppress(Exception):
        await actor.handle.close()


async def _awaited(future: Any) -> Any:
    return await future
