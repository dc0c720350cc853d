"""Rollout starts spaced in time (the run's `start_rate`).

A wave whose rollouts start together gets its model replies back together, and so does every turn after it: each
turn's replies, commands and next requests arrive at the workers and sandboxes as one burst that they work through
together, so every rollout waits for the whole burst at every turn (256 rollouts on 2 cores: 1.4-1.6 s past the ideal
on average after 9 turns). Started a few milliseconds apart, the rollouts keep that spacing turn after turn and
each turn's work arrives as fast as the machine does it. The spacing costs the last rollout its delay; it pays where
a burst takes the machine longer than the spread (docs/benchmarks.md, "Issue 40, 2026-12-07")."""

from __future__ import annotations

import asyncio
import time


class StartPacer:
    """`await pacer.wait()` before each start: starts at most `rate` a second, evenly spaced; a start that comes after
    a quiet spell goes at once (the pace holds back bursts, not a steady flow). `rate` 0: no pacing."""

    def __init__(self, rate: float):
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0  # the monotonic time of the next free slot

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.monotonic()
        slot = max(now, self._next)
        self._next = slot + self.interval  # taken before sleeping: the starts waiting now queue in call order
        if slot > now:
            await asyncio.sleep(slot - now)
