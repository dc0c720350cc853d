"""A turn's burst of commands, one after another: at most N commands of a process begin at once, first come first
served.

When a wave's model replies arrive together, every rollout sends its command at the same moment. Left to the kernel,
the hundreds of shells share the cores evenly and nearly all of them finish at the end of the burst; their rollouts
then ask the model together again, and the next burst repeats it, turn after turn. With the burst's commands taken
in order, each finishes in its turn: the rollouts leave the burst spread out, and the next turn's replies come back
spread out the same way. The worker's own event loop also keeps the CPU it needs to pass the replies on.

A command holds its slot until it ends or until `hold_s` has passed, whichever is first: a long command (a test run,
a build) lets the next one begin after `hold_s` and goes on beside it, so the gate orders short commands without
running long ones one at a time. Measured in docs/benchmarks.md ("Issue 40, session 30").

Every sandbox of a worker runs its commands on the worker's event loop (plain asyncio, one thread, no locks), like
the start limits (limiter.py), whose FIFO semaphore this uses.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace

from .base import ExecResult
from .limiter import StartingCap

DEFAULT_SLOTS = 3
"""Commands of one worker process that may begin at once. Measured: a wave of 256 in 2 worker processes on 2 cores
ran closest to the ideal with 2-4 (1: a little further), 1,024 in 12 on 16 cores gained with 3."""
DEFAULT_HOLD_S = 0.02
"""How long a running command keeps its slot at most: longer than a short command's few milliseconds, and short
enough that a burst of long commands still begins at slots / hold_s a second (150 at the defaults)."""


class CommandGate:
    def __init__(self, slots: int, hold_s: float):
        if hold_s <= 0:
            raise ValueError("hold_s must be positive")
        self.cap = StartingCap(slots)
        self.hold_s = hold_s

    async def run(self, command: Callable[[], Awaitable[ExecResult]]) -> ExecResult:
        """Run `command()` once a slot is free; its result's duration includes the wait for the slot (the time the
        rollout spent on it)."""
        asked = time.monotonic()
        await self.cap.acquire()
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.cap.release()

        timer = asyncio.get_running_loop().call_later(self.hold_s, release)
        try:
            result = await command()
        finally:
            timer.cancel()
            release()
        return replace(result, duration_s=time.monotonic() - asked)


_gates: dict[tuple[int, float], CommandGate] = {}


def command_gate(slots: int, hold_s: float) -> CommandGate | None:
    """This process's gate for these numbers (None for 0 slots: no gate). Sandboxes configured alike share one gate;
    a deployment with other numbers gets its own."""
    if slots == 0:
        return None
    key = (slots, hold_s)
    if key not in _gates:
        _gates[key] = CommandGate(slots, hold_s)
    return _gates[key]
