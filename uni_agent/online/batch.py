"""One submitted batch of the rollout service: rows x n rollouts for one policy version, handed back as they finish.

    batch = await service.submit(rows, n=4, version=3)
    async for result in batch: ...          # each rollout as it finishes (a RolloutResult, one Parquet row)
    async for group in batch.groups(): ...  # all n rollouts of one row together, as soon as the last one finished
    results = await batch.results()         # the whole batch, in submit order
    await batch.cancel()                    # what has not finished stops; its sandboxes close

A cancelled rollout is not recorded and not yielded; `cancelled` counts them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..episode.rollout import RolloutResult, RolloutSpec


@dataclass
class Group:
    """The n rollouts of one input row in one batch (a GRPO group): `results` in rollout order."""

    row_index: int
    instance_id: str
    results: list[RolloutResult] = field(default_factory=list)

    @property
    def rewards(self) -> list[float]:
        return [r.reward for r in self.results]


class RolloutBatch:
    def __init__(self, batch_id: str, step: int, version: int, n: int, specs: list[RolloutSpec],
                 cancel_on_actors: Callable[[list[tuple[str, int]]], Awaitable[int]]):
        self.id, self.step, self.version, self.n = batch_id, step, version, n
        self.specs = specs
        self._cancel_on_actors = cancel_on_actors
        self.tasks: dict[tuple[str, int], asyncio.Task[RolloutResult | None]] = {}
        self.finished: dict[tuple[str, int], RolloutResult] = {}
        self.cancelled = 0
        self.errors: dict[tuple[str, int], BaseException] = {}
        # Keys whose landing ran. Not task.done(): a task is done a loop step or more before its done callback (the
        # landing) runs, and a row judged complete in between was handed on without its last result.
        self._landed_keys: set[tuple[str, int]] = set()
        self._arrived = asyncio.Event()  # set (and replaced) at every landing: wakes every waiting iterator
        self._members: dict[int, list[tuple[str, int]]] = {}  # row index -> its rollouts' keys
        for spec in specs:
            self._members.setdefault(spec.row_index, []).append(spec.key)

    def track(self, spec: RolloutSpec, task: asyncio.Task[RolloutResult | None]) -> None:
        self.tasks[spec.key] = task
        task.add_done_callback(lambda t, key=spec.key: self._landed(key, t))

    def _landed(self, key: tuple[str, int], task: asyncio.Task[RolloutResult | None]) -> None:
        if task.cancelled():
            self.cancelled += 1
        elif task.exception() is not None:  # a bug, not a failed rollout (those are rows): raised by results()
            self.errors[key] = task.exception()
        elif task.result() is not None:  # None: no agent worker was left to run it (the service logs it)
            self.finished[key] = task.result()
        self._landed_keys.add(key)
        arrived, self._arrived = self._arrived, asyncio.Event()
        arrived.set()

    @property
    def done(self) -> bool:
        return bool(self.tasks) and self._landed_keys.issuperset(self.tasks)

    @property
    def in_flight(self) -> int:
        return sum(key not in self._landed_keys for key in self.tasks)

    async def __aiter__(self) -> AsyncIterator[RolloutResult]:
        """Each rollout as it finishes (those finished before the iteration began come first)."""
        seen: set[tuple[str, int]] = set()
        while True:
            for key, result in list(self.finished.items()):
                if key not in seen:
                    seen.add(key)
                    yield result
            if self.done:
                return
            await self._arrived.wait()

    async def groups(self) -> AsyncIterator[Group]:
        """Each row's n rollouts together, as soon as the last of them finished. A row some of whose rollouts were
        cancelled comes with those that finished (or not at all when none did)."""
        given: set[int] = set()
        async for _ in self:
            for row_index, keys in self._members.items():
                if row_index in given or not self._landed_keys.issuperset(keys):
                    continue
                given.add(row_index)
                results = [self.finished[k] for k in keys if k in self.finished]
                if results:
                    yield Group(row_index, results[0].instance_id, results)
        for row_index, keys in self._members.items():  # rows whose last rollouts were cancelled
            results = [self.finished[k] for k in keys if k in self.finished]
            if row_index not in given and results:
                yield Group(row_index, results[0].instance_id, results)

    async def results(self) -> list[RolloutResult]:
        """The whole batch, in submit order (cancelled rollouts left out); waits for the last one."""
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()))
        for (instance_id, rollout), error in self.errors.items():
            raise RuntimeError(f"rollout {instance_id} #{rollout} of batch {self.id} failed: {error!r}") from error
        return [self.finished[s.key] for s in self.specs if s.key in self.finished]

    async def cancel(self) -> int:
        """Stop every rollout of the batch that has not finished: the agent workers cancel them (their sandboxes
        close) and they are not recorded. Returns how many were cancelled."""
        open_keys = [k for k, t in self.tasks.items() if not t.done()]
        if not open_keys:
            return 0
        await self._cancel_on_actors(open_keys)
        for key in open_keys:
            self.tasks[key].cancel()
        await asyncio.wait([self.tasks[k] for k in open_keys])
        return len(open_keys)

    def describe(self) -> dict[str, Any]:
        return {"batch": self.id, "step": self.step, "version": self.version, "rollouts": len(self.specs),
                "finished": len(self.finished), "in_flight": self.in_flight, "cancelled": self.cancelled}
