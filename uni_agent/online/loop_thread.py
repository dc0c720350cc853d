"""The service from synchronous code (a trainer's own loop, a test): an event loop in a thread of its own.

    loop = LoopThread()
    service = loop.run(RolloutService.start(output_dir="outputs/rl"))
    batch = loop.run(service.submit(rows, n=4))
    results = loop.run(batch.results())
    loop.run(service.close()); loop.stop()

Everything of one service runs on that one loop (its Dask client belongs to it), so every call goes through `run`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, name: str = "uni-agent-online") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run `coroutine` on the loop and return its result (its exception, raised here)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        if not self.loop.is_running():
            self.loop.close()
