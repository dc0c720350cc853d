"""Which policy version each engine replica serves, as one agent worker sees it, and the pause around a switch of
weights (uni_agent.online.weights).

Every model call is bracketed: `begin` notes the replica's version and how many switches it has begun; once the
call is back, `switched` says whether a switch began meanwhile. A call that saw no switch was sampled, all of it, by
the version noted, and its tokens carry it. A call that overlapped one (it was still running when the drain gave up,
or it was cut off and retried into the new server) may hold either weights' tokens: it is made again. A paused
replica takes no new call until it is resumed on its new version; its rollouts wait for it rather than move."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

DRAIN_POLL_S = 0.05


@dataclass(frozen=True)
class Call:
    version: int
    switches: int


class ReplicaVersions:
    def __init__(self, urls: list[str], version: int = 0):
        self.version = dict.fromkeys(urls, version)
        self.calls = dict.fromkeys(urls, 0)  # model calls in flight on each replica
        self.answered = dict.fromkeys(urls, 0)  # model calls made on each replica so far (answered or failed)
        self.switches = dict.fromkeys(urls, 0)  # weight switches begun on each replica
        self._open = {url: asyncio.Event() for url in urls}  # cleared while the replica switches
        for gate in self._open.values():
            gate.set()

    def paused(self, url: str) -> bool:
        return not self._open[url].is_set()

    async def wait_open(self, url: str) -> None:
        await self._open[url].wait()

    def begin(self, url: str) -> Call:
        self.calls[url] += 1
        return Call(self.version[url], self.switches[url])

    def end(self, url: str) -> None:
        self.calls[url] -= 1
        self.answered[url] += 1

    def switched(self, url: str, call: Call) -> bool:
        return self.switches[url] != call.switches

    async def pause(self, url: str, drain_timeout: float) -> int:
        """No new calls to `url`; wait up to `drain_timeout` s for those in flight. Returns how many still run (they
        will be made again after the switch)."""
        self._open[url].clear()
        deadline = time.monotonic() + drain_timeout
        while self.calls[url] and time.monotonic() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)
        self.switches[url] += 1
        return self.calls[url]

    def resume(self, url: str, version: int) -> None:
        self.version[url] = version
        self._open[url].set()
