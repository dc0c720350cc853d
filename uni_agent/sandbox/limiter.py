"""Start limits shared by every sandbox of a process: how many may be starting at once, and how fast they are created.

Every sandbox of a Dask worker starts on the worker's event loop: the agent loops run there, and so does
verification (a coroutine, uni_agent/grading/). So the limits are plain asyncio, for one thread: no locks. A process
may run event loops one after another (asyncio.run in a CLI or a test); a waiter belongs to the loop that made it.
Limits are per process: N worker processes may have N x `max_starting` sandboxes starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


class StartingCap:
    """A counting semaphore for the coroutines of one thread (FIFO, cancellation-safe). Unlike asyncio.Semaphore it
    is not tied to the first event loop that waits on it, so a process-wide cap outlives an asyncio.run."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._held = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self.max_held = 0  # the most ever held at once (for tests and logs)

    @property
    def held(self) -> int:
        return self._held

    async def acquire(self) -> None:
        if self._held < self.limit and not self._waiters:
            self._take()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted just before the cancellation: pass the slot on
                self.release()
            else:  # release() may have dropped it already
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def _take(self) -> None:
        self._held += 1
        self.max_held = max(self.max_held, self._held)

    def release(self) -> None:
        # Hand the slot straight to the next waiter still waiting (the count stays the same).
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._held -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


class RateLimiter:
    """At most `rate` events per second, with bursts of up to `burst` (a generic cell rate algorithm).

    Each caller reserves the next free instant and waits until then; a cancelled wait gives nothing back, which
    errs on the slow side."""

    def __init__(self, rate: float, burst: int = 1):
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.interval = 1.0 / rate
        self.tolerance = (burst - 1) * self.interval
        self._tat = 0.0  # theoretical arrival time of the next event

    def reserve(self) -> float:
        """Seconds the caller must wait before its event (0 when it may go now)."""
        now = time.monotonic()
        tat = max(self._tat, now)
        self._tat = tat + self.interval
        return max(0.0, tat - self.tolerance - now)

    async def wait(self) -> None:
        delay = self.reserve()
        if delay > 0:
            await asyncio.sleep(delay)


@dataclass
class StartLimits:
    cap: StartingCap
    rate: RateLimiter | None = None
    key: tuple = field(default=())


_registry: dict[tuple, StartLimits] = {}


def start_limits(key: tuple, max_starting: int, per_second: float | None = None) -> StartLimits:
    """The process-wide limits for `key` (e.g. ("modal", app_name)); the first caller's numbers win until
    different numbers are asked for, which replaces them (sandboxes already waiting keep the old ones)."""
    limits = _registry.get(key)
    same = limits is not None and limits.cap.limit == max_starting and (
        (limits.rate is None and per_second is None)
        or (limits.rate is not None and per_second is not None
            and abs(limits.rate.interval - 1.0 / per_second) < 1e-12))
    if limits is None or not same:
        limits = _registry[key] = StartLimits(StartingCap(max_starting),
                                              RateLimiter(per_second) if per_second else None, key)
    return limits
