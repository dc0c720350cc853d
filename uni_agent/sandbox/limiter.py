"""Start limits shared by every sandbox of a process: how many may be starting at once, and how fast they are created.

A Dask worker runs agent loops on its event loop and verifications in threads, each with its own `asyncio.run`
loop, so a plain `asyncio.Semaphore` (bound to one loop) cannot be the process-wide cap. These primitives keep their
state under a `threading.Lock` and wake a waiter on its own loop (`call_soon_threadsafe`); waiting never blocks a
loop. Limits are per process: N worker processes may have N x `max_starting` sandboxes starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


class StartingCap:
    """A counting semaphore usable from any event loop in any thread (FIFO, cancellation-safe)."""

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self._lock = threading.Lock()
        self._held = 0
        self._waiters: deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = deque()
        self.max_held = 0  # the most ever held at once (for tests and logs)

    @property
    def held(self) -> int:
        return self._held

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._held < self.limit and not self._waiters:
                self._take()
                return
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.append((loop, waiter))
        try:
            await waiter
        except asyncio.CancelledError:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove((loop, waiter))
            # Dequeued by release() already: either the grant landed before the cancellation (we hold a slot:
            # give it back), or it is still on its way and `_grant` will see the cancelled future and pass it on.
            if waiter.done() and not waiter.cancelled():
                self.release()
            raise

    def _take(self) -> None:
        self._held += 1
        self.max_held = max(self.max_held, self._held)

    def release(self) -> None:
        with self._lock:
            if not self._waiters:
                self._held -= 1
                return
            # Hand the slot straight to the next waiter (the count stays the same).
            loop, waiter = self._waiters.popleft()
        try:
            loop.call_soon_threadsafe(_grant, waiter, self)
        except RuntimeError:  # that waiter's loop is closed: it will never run; give the slot to the next one
            self.release()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()


def _grant(waiter: asyncio.Future[None], cap: StartingCap) -> None:
    if waiter.cancelled():  # cancelled after it was dequeued: its slot goes on to the next waiter
        cap.release()
    else:
        waiter.set_result(None)


class RateLimiter:
    """At most `rate` events per second, with bursts of up to `burst` (a generic cell rate algorithm).

    Each caller reserves the next free instant and waits until then; a cancelled wait gives nothing back, which
    errs on the slow side. Usable from any event loop in any thread."""

    def __init__(self, rate: float, burst: int = 1):
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be positive and burst at least 1")
        self.interval = 1.0 / rate
        self.tolerance = (burst - 1) * self.interval
        self._lock = threading.Lock()
        self._tat = 0.0  # theoretical arrival time of the next event

    def reserve(self) -> float:
        """Seconds the caller must wait before its event (0 when it may go now)."""
        now = time.monotonic()
        with self._lock:
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
_registry_lock = threading.Lock()


def start_limits(key: tuple, max_starting: int, per_second: float | None = None) -> StartLimits:
    """The process-wide limits for `key` (e.g. ("modal", app_name)); the first caller's numbers win until
    different numbers are asked for, which replaces them (sandboxes already waiting keep the old ones)."""
    with _registry_lock:
        limits = _registry.get(key)
        same = limits is not None and limits.cap.limit == max_starting and (
            (limits.rate is None and per_second is None)
            or (limits.rate is not None and per_second is not None
                and abs(limits.rate.interval - 1.0 / per_second) < 1e-12))
        if not same:
            limits = StartLimits(StartingCap(max_starting), RateLimiter(per_second) if per_second else None, key)
            _registry[key] = limits
        assert limits is not None
        return limits
