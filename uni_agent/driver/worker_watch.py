"""Actor calls that end when the actor's worker leaves the cluster.

A Dask actor call that is in flight when its worker dies can wait forever: distributed's Actor answers a broken
connection by awaiting the actor's own future, and when the scheduler's word that the actor erred arrives after the
broken connection (the usual order through the scheduler's proxy), that await raises inside a callback and the call's
future is never resolved. Seen with a worker killed -9 during the online service's update_weights: the pause broadcast
and the mailbox's long poll on the dead actor never returned, so the update hung and the dead worker's rollouts were
never run again; a batch run's mailbox waits on the same calls.

So every call to an agent worker (ActorPool wraps each handle) also watches the scheduler's list of workers (one poll
a second, shared by every waiting call) and fails with WorkerLeft as soon as the actor's worker is no longer on it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

WATCH_S = 1.0  # how often the scheduler is asked which workers it lists, while a call waits


class WorkerLeft(OSError):
    """The actor's worker is gone: the call will not be answered (an OSError, as distributed's lost-worker errors)."""


class WorkerWatch:
    def __init__(self, live_workers: Callable[[], Awaitable[set[str]]], every: float = WATCH_S):
        self.live_workers, self.every = live_workers, every
        self._waiting: dict[str, list[asyncio.Future[None]]] = {}
        self._poller: asyncio.Task[None] | None = None

    async def call(self, worker: str, awaitable: Awaitable[Any], what: str) -> Any:
        """`awaitable`'s result, or WorkerLeft once `worker` is no longer listed."""
        answer = asyncio.ensure_future(awaitable)
        left: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(worker, []).append(left)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.ensure_future(self._poll())
        try:
            await asyncio.wait({answer, left}, return_when=asyncio.FIRST_COMPLETED)
            if answer.done():
                return answer.result()
            raise WorkerLeft(f"{what}: worker {worker} left the cluster before it answered")
        finally:
            if not answer.done():
                answer.cancel()
            waiting = self._waiting.get(worker, [])
            if left in waiting:
                waiting.remove(left)
            if not waiting:
                self._waiting.pop(worker, None)

    async def close(self) -> None:
        """The poll stopped once no call waits: it sleeps up to `every` past the last call, and an event loop closed
        under it warns "Task was destroyed but it is pending" (CI's log printed it at the end of the suite). A call
        still waiting keeps its watch; the poll then ends with the last such call."""
        if self._waiting:
            return
        poller, self._poller = self._poller, None
        if poller is not None and not poller.done():
            poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await poller

    async def _poll(self) -> None:
        while self._waiting:
            await asyncio.sleep(self.every)
            with contextlib.suppress(Exception):  # cannot tell now: ask again next time
                live = await self.live_workers()
                for worker in [w for w in self._waiting if w not in live]:
                    for left in self._waiting.pop(worker):
                        if not left.done():
                            left.set_result(None)


class WatchedActor:
    """An actor handle whose every method call is WorkerWatch.call: same methods, same results."""

    def __init__(self, actor: Any, worker: str, watch: WorkerWatch):
        self._actor, self._worker, self._watch = actor, worker, watch

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._actor, name)  # raises at once when distributed already knows the actor is lost

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await self._watch.call(self._worker, _awaited(method(*args, **kwargs)), name)
        return call


async def _awaited(future: Any) -> Any:
    return await future
