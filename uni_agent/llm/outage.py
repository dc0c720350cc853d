"""Whether the engines this process calls are all down, and when they were: an episode whose wall clock ran out
while they were ended for the outage, not for its model (uni_agent.episode.failures).

Each ChatClient reports here when its endpoint accepts no connection or is not serving yet (EndpointDownError) and
when it answers again. An endpoint is one engine of one run (scope and first URL: it keeps its name when it moves,
uni_agent.llm.relocation); while every endpoint an open client calls is down, this process is in an outage. The last
KEPT outages are remembered, so that a rollout's end can ask how much of its life fell in one.
"""

from __future__ import annotations

import time
import weakref
from collections import deque

KEPT = 256
Endpoint = tuple[str, str]  # (scope, first URL)


class Outages:
    def __init__(self) -> None:
        self._open: dict[int, Endpoint] = {}  # id of each open client -> the endpoint it calls
        self._down_since: dict[Endpoint, float] = {}  # endpoints seen down, since when (time.time())
        self._since: float | None = None  # every endpoint down since
        self._periods: deque[tuple[float, float]] = deque(maxlen=KEPT)

    def opened(self, client: object, endpoint: Endpoint) -> None:
        """`client` calls `endpoint` until `closed` (or until it is collected)."""
        if id(client) not in self._open:
            self._open[id(client)] = endpoint
            weakref.finalize(client, self.closed, id(client))
            self._update()

    def closed(self, client_id: int) -> None:
        endpoint = self._open.pop(client_id, None)
        if endpoint is not None and endpoint not in self._open.values():
            self._down_since.pop(endpoint, None)
        self._update()

    def down(self, endpoint: Endpoint) -> None:
        if endpoint not in self._down_since:
            self._down_since[endpoint] = time.time()
            self._update()

    def up(self, endpoint: Endpoint) -> None:
        if self._down_since.pop(endpoint, None) is not None:
            self._update()

    def _update(self) -> None:
        endpoints = set(self._open.values())
        every_one_down = bool(endpoints) and all(e in self._down_since for e in endpoints)
        if every_one_down and self._since is None:
            self._since = max(self._down_since[e] for e in endpoints)  # when the last of them went down
        elif not every_one_down and self._since is not None:
            self._periods.append((self._since, time.time()))
            self._since = None

    def seconds_within(self, start: float, end: float | None = None) -> float:
        """Seconds between `start` and `end` (default: now; both time.time()) during which every engine was down."""
        end = time.time() if end is None else end
        periods = [*self._periods, *([(self._since, end)] if self._since is not None else [])]
        return sum(max(0.0, min(stop, end) - max(begin, start)) for begin, stop in periods)


OUTAGES = Outages()  # this process's (an agent worker's clients share it)


def engine_outage_s(start: float, end: float | None = None) -> float:
    """Seconds between `start` and `end` during which every engine this process calls was down."""
    return OUTAGES.seconds_within(start, end)
