"""Placing an engine again when its worker leaves (a SLURM job cancelled, a node lost, a worker killed).

A server dies with its worker (PR_SET_PDEATHSIG), and Dask then fails the actor's future ("Worker holding Actor was
lost"). The driver's engine watch (watch.py) hands such a replica to `Replacement.tend`, which starts the same server
on another worker with room, within the restart budget (at most engine_max_restarts placements within
engine_restart_window per replica; with engine_restart_on_crash off, none), and tells every worker process where it
serves now: EngineMoves, a worker plugin (a worker that joins later gets it too), records the move in
uni_agent.llm.relocation. The agents keep the URL they were given as the engine's name, so their calls that wait for
the lost engine (engine_down_wait) go on with the new one.

Where "room" is, the engine's start function says (its PlaceAgain): a CPU llama-server goes to the live worker that
holds the fewest engines; a GPU group to free devices of a GPU worker (placement.py). When no worker has room, NoRoom:
the replica waits, asked again at every poll of the watch (a GPU worker may join), and that costs no budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from distributed.diagnostics.plugin import WorkerPlugin

from ..llm.relocation import forget_moves, record_moves, scope_of
from .placement import PlacementError
from .running import LOST
from .running import RunningEngines as Engines  # the run's engines as these functions see them

log = structlog.get_logger("uni_agent.engines")
Report = Callable[..., None]  # watch._report: (level, message, event, **fields)


@dataclass
class Placed:
    """A replica's server, started anew: its actor (and the future that keeps it), worker and URL."""

    actor: Any
    future: Any
    worker: str
    url: str


class NoRoom(RuntimeError):
    """No worker can take the replica now; asked again at the next poll."""


PlaceAgain = Callable[[int, set[str]], Awaitable[Placed]]  # (replica index, live workers) -> its server, serving


class EngineMoves(WorkerPlugin):
    """The run's engine moves, given to every worker process (uni_agent.llm.relocation)."""

    def __init__(self, scope: str, moves: dict[str, str]):
        self.scope, self.moves = scope, dict(moves)

    def setup(self, worker: Any) -> None:
        record_moves(self.scope, self.moves)

    def teardown(self, worker: Any) -> None:
        forget_moves(self.scope)


class Replacement:
    """The re-placing of one run's engine replicas: which are lost, their budget, their placements under way."""

    def __init__(self, client: Any, place: PlaceAgain, *, allowed: bool, max_restarts: int, window: float):
        self.client, self.place = client, place
        self.allowed, self.max_restarts, self.window = allowed, max_restarts, window
        self.placing: dict[int, asyncio.Task] = {}
        self.down_since: dict[int, float] = {}  # lost replicas, since when (monotonic)
        self.attempts: dict[int, deque[float]] = {}  # placements started per replica (the budget)
        self.failed: dict[int, str] = {}  # replicas down for good: why
        self.waiting: set[int] = set()  # lost replicas told there is no room (said once)
        self.placed = 0  # servers placed again so far

    def is_down(self, engines: Engines, index: int) -> bool:
        return index in self.failed or engines.futures[index].status in LOST

    async def tend(self, engines: Engines, report: Report) -> None:
        """At each poll of the watch: notice lost replicas, start their placements, settle those that ended."""
        for index, task in list(self.placing.items()):
            if task.done():
                del self.placing[index]
                await self._settle(engines, index, task, report)
        lost = [i for i in range(len(engines.actors))
                if i not in self.failed and i not in self.placing and engines.futures[i].status in LOST]
        if not lost:
            return
        live = set((await self.client.scheduler.identity(n_workers=-1))["workers"])
        for index in lost:
            where = f"engine {index} ({engines.urls[index]}, on worker {engines.workers[index]})"
            if index not in self.down_since:
                self.down_since[index] = time.monotonic()
                report("error", f"{where} is down: its worker left; placing it again", "engine_lost",
                       replica=index, worker=engines.workers[index])
            if not self._budget_left(index):
                why = ("engine_restart_on_crash is off" if not self.allowed else
                       f"it was placed again {len(self.attempts[index])} times within {self.window:g} s "
                       f"(engine_max_restarts={self.max_restarts})")
                self.failed[index] = f"{where} is down for good: its worker left and {why}"
                report("error", self.failed[index], "engine_failed", replica=index, failure=self.failed[index])
                continue
            self.placing[index] = asyncio.ensure_future(self.place(index, live))

    def _budget_left(self, index: int) -> bool:
        if not self.allowed:
            return False
        times = self.attempts.setdefault(index, deque())
        while times and time.monotonic() - times[0] > self.window:
            times.popleft()
        return len(times) < self.max_restarts

    async def _settle(self, engines: Engines, index: int, task: asyncio.Task, report: Report) -> None:
        where = f"engine {index} ({engines.urls[index]})"
        error = task.exception()
        if isinstance(error, (NoRoom, PlacementError)):
            if index not in self.waiting:
                self.waiting.add(index)
                report("warning", f"{where}: no worker has room for it now ({error}); waiting for one (calls wait up "
                                  "to engine_down_wait for it)", "engine_waiting_for_room", replica=index)
            return
        self.attempts.setdefault(index, deque()).append(time.monotonic())
        if error is not None:
            report("error", f"{where} did not start again: {type(error).__name__}: {str(error)[:300]}",
                   "engine_replace_failed", replica=index, error=f"{type(error).__name__}: {error}"[:2000])
            return
        placed: Placed = task.result()
        down_s = time.monotonic() - self.down_since.pop(index)
        self.waiting.discard(index)
        previous = engines.workers[index]
        engines.actors[index], engines.futures[index] = placed.actor, placed.future
        engines.workers[index] = placed.worker
        engines.moves[engines.urls[index]] = placed.url
        await publish_moves(self.client, engines)
        self.placed += 1
        report("warning", f"{where} serves again at {placed.url} on worker {placed.worker} (its worker {previous} "
                          f"left; down {down_s:.1f} s)", "engine_replaced", replica=index, url=placed.url,
               worker=placed.worker, down_s=round(down_s, 3))

    async def close(self, engines: Engines) -> None:
        """Stop the placements under way (a server one of them started is stopped) and the moves' plugin."""
        for task in self.placing.values():
            task.cancel()
        for task in self.placing.values():
            with contextlib.suppress(BaseException):
                placed = await task
                await placed.actor.stop()
        self.placing.clear()
        if engines.moves:
            with contextlib.suppress(Exception):
                await self.client.unregister_worker_plugin(plugin_name(engines))
            forget_moves(scope_of(engines.api_key))


def plugin_name(engines: Engines) -> str:
    return f"uni-agent-engine-moves-{scope_of(engines.api_key)}"


async def publish_moves(client: Any, engines: Engines) -> None:
    """Every worker process (and this one) learns where the run's engines serve now."""
    scope = scope_of(engines.api_key)
    record_moves(scope, engines.moves)
    await client.register_plugin(EngineMoves(scope, engines.moves), name=plugin_name(engines))


async def start_pinned(future: Any, worker: str, timeout: float) -> Placed:
    """The server actor of `future` (pinned to `worker`), started and serving; on failure nothing is left running.
    Bounded: an actor pinned to a worker that dies before it is made would never be made."""
    try:
        actor = await asyncio.wait_for(future, timeout)
        url = await actor.start(timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await future.cancel()
        raise
    return Placed(actor, future, worker, url)


def least_held(live: set[str], engines: Engines, index: int, avoid: set[str] | None = None) -> str:
    """The live worker (outside `avoid`) that holds the fewest of the run's other serving engines."""
    held = Counter(w for i, w in enumerate(engines.workers) if i != index and engines.futures[i].status not in LOST)
    candidates = sorted(live - (avoid or set()))
    if not candidates:
        raise NoRoom("no live worker")
    return min(candidates, key=held.__getitem__)
