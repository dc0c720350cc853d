"""Rollouts to an AgentWorker actor in batches: two long-lived calls per actor rather than one call per rollout.

A Dask actor call holds one connection of the driver's connection pool (512 by default) for as long as it runs, so a
call per rollout would cap a driver at 512 rollouts in flight whatever the agent's `concurrency` says (asking for
1,000 would run 2 x 256 at a time; `uni-agent bench --simulate` measures it) and cost a TCP connection per rollout.
So the driver hands specs over in batches (`AgentWorker.start_rollouts` returns at once) and one long poll per actor
(`AgentWorker.collect`) brings finished results back in batches. A failed call (the actor's worker died) fails every
rollout waiting on that actor with ActorUnreachable, and the dispatcher runs them again elsewhere without counting
it against them: the worker, not the rollout, failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from ..episode.rollout import Batch, RolloutRaised, RolloutResult, RolloutSpec

POLL_S = 2.0  # how long one collect call waits for a result before returning empty


class ActorCallError(RuntimeError):
    """The actor, or the rollout inside it, failed (the message says which and why)."""


class ActorUnreachable(ActorCallError):
    """A call to the actor itself failed (its worker died or cannot be reached): the rollouts waiting on it were
    interrupted, not failed."""


class ActorMailbox:
    def __init__(self, actor: Any, poll_s: float = POLL_S):
        self.actor, self.poll_s = actor, poll_s
        self.pending: dict[tuple[str, int], asyncio.Future[RolloutResult]] = {}
        self.outbox: list[RolloutSpec] = []
        self.failed: str | None = None
        self._wake = asyncio.Event()
        self._tasks = [asyncio.ensure_future(self._send()), asyncio.ensure_future(self._collect())]

    async def run(self, spec: RolloutSpec) -> RolloutResult:
        if self.failed is not None:
            raise ActorUnreachable(self.failed)
        future: asyncio.Future[RolloutResult] = asyncio.get_running_loop().create_future()
        self.pending[spec.key] = future
        self.outbox.append(spec)
        self._wake.set()
        try:
            return await future
        finally:
            if self.pending.get(spec.key) is future:
                del self.pending[spec.key]

    async def _send(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(0.01)  # a burst of specs (a run's start, a wave of finishes) goes as one call
            self._wake.clear()
            batch, self.outbox = self.outbox, []
            try:
                await self.actor.start_rollouts(Batch(batch))
            except Exception as exc:
                self._fail(exc)
                return

    async def _collect(self) -> None:
        while True:
            try:
                finished = await self.actor.collect(self.poll_s)
            except Exception as exc:
                self._fail(exc)
                return
            for outcome in finished.items:
                future = self.pending.get((outcome.key[0], int(outcome.key[1])))
                if future is None or future.done():
                    continue  # its driver-side wait was cancelled
                try:
                    future.set_result(outcome.unwrap())
                except RolloutRaised as exc:
                    future.set_exception(ActorCallError(str(exc)))

    def _fail(self, exc: BaseException) -> None:
        self.failed = f"{type(exc).__name__}: {exc}"
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ActorUnreachable(self.failed))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task


class Mailboxes:
    """One mailbox per live actor; an actor whose mailbox failed gets a new one on its next rollout (the failure may
    have been the connection, not the actor: the dispatcher asks the scheduler before dropping the actor)."""

    def __init__(self) -> None:
        self.boxes: dict[int, ActorMailbox] = {}

    async def run(self, actor: Any, spec: RolloutSpec) -> RolloutResult:
        box = self.boxes.get(id(actor))
        if box is None or box.failed is not None:
            if box is not None:
                asyncio.ensure_future(box.close())  # no await here: a second caller must see the new box
            box = self.boxes[id(actor)] = ActorMailbox(actor)
        return await box.run(spec)

    async def close(self) -> None:
        for box in self.boxes.values():
            await box.close()
        self.boxes.clear()
