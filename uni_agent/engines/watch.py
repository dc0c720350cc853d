"""The driver's watch over its engine servers while rollouts run: each crash and restart a server actor reports
(uni_agent.engines.server) is logged and shown, a replica whose worker left is said to be down and where, and placed
again (replace.py), and when no replica is left serving (each one crashed or was lost past its restart budget) the run
ends with EngineFailed instead of failing its remaining rollouts one by one."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog

from .running import RunningEngines as Engines  # the run's engines as these functions see them

log = structlog.get_logger("uni_agent.engines")
T = TypeVar("T")
Notify = Callable[[str, str], None]  # (level, message): the run's notices (dashboard page), besides log and stderr
POLL_S = 2.0
DESCRIBE_TIMEOUT_S = 30.0


class EngineFailed(RuntimeError):
    """Every engine replica is down for good. What finished is recorded; the rollouts that did not are not, so a
    rerun with the same output dir runs them."""


async def guard(engines: Engines, work: Awaitable[T], notify: Notify | None = None, poll: float = POLL_S) -> T:
    """`work`'s result, unless every server of `engines` fails first: then `work` is cancelled and EngineFailed
    raised. Without server actors (an external endpoint) it is `work` alone."""
    task = asyncio.ensure_future(work)
    if not engines.actors:
        return await task
    watcher = asyncio.ensure_future(watch(engines, notify, poll))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done():  # the watch ended: every engine is down
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            watcher.result()  # raises EngineFailed
        return task.result()
    finally:
        for pending in (task, watcher):
            pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await watcher


async def watch(engines: Engines, notify: Notify | None = None, poll: float = POLL_S) -> None:
    """Report new crashes and restarts of the servers, place lost ones again; raise EngineFailed once none of them
    serves."""
    seen: dict[int, tuple[Any, _Seen]] = {}  # replica -> (its actor, what was reported of it): a new actor, anew
    replacement = engines.replacement
    report = lambda *args, **fields: _report(notify, *args, **fields)  # noqa: E731
    while True:
        if replacement is not None:
            try:
                await replacement.tend(engines, report)
            except Exception as exc:  # noqa: BLE001 - the scheduler busy or gone: ask again next time
                log.warning("engine_tend_failed", error=repr(exc))
        states = []
        for index, actor in enumerate(engines.actors):
            if replacement is not None and replacement.is_down(engines, index):
                states.append("failed" if index in replacement.failed else "lost")
                continue
            if index not in seen or seen[index][0] is not actor:
                seen[index] = (actor, _Seen())
            try:
                info = await asyncio.wait_for(actor.describe(), DESCRIBE_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - cannot tell now (a busy worker): ask again next time
                log.debug("engine_describe_failed", replica=index, error=repr(exc))
                states.append("unknown")
                continue
            states.append(info["state"])
            seen[index][1].report(index, info, notify)
        if states and all(state == "failed" for state in states):
            failures = [s.failure for _, s in seen.values() if s.failure]
            failures += list(replacement.failed.values()) if replacement is not None else []
            raise EngineFailed(
                f"every engine replica is down for good ({len(states)} of {len(states)}); the rollouts that did not "
                f"finish are not recorded: fix the engine and rerun with the same output dir. " + failures[0])
        await asyncio.sleep(poll)


class _Seen:
    """What the watch already reported of one server."""

    def __init__(self) -> None:
        self.crashes = self.restarts = 0
        self.failure: str | None = None

    def report(self, index: int, info: dict[str, Any], notify: Notify | None) -> None:
        name, url = info["name"], info["url"]
        for crash in info["crashes"][self.crashes:]:
            why = f" ({crash['error'][:300]})" if crash.get("error") else ""
            _report(notify, "error", f"engine {name} at {url} exited with code {crash['returncode']}{why}",
                    "engine_crashed", replica=index, returncode=crash["returncode"],
                    log_tail=crash["log_tail"][-1000:])
        self.crashes = len(info["crashes"])
        if info["state"] == "serving" and info["restarts"] > self.restarts:
            self.restarts = info["restarts"]
            down_s = next((c["down_s"] for c in reversed(info["crashes"]) if "down_s" in c), None)
            down = f", down {down_s:.1f} s" if down_s is not None else ""
            _report(notify, "warning", f"engine {name} serves again at {url} (restart {self.restarts}{down})",
                    "engine_restarted", replica=index, restarts=self.restarts, down_s=down_s)
        if info["state"] == "failed" and self.failure is None:
            self.failure = info["failure"]
            _report(notify, "error", info["failure"].splitlines()[0], "engine_failed", replica=index,
                    failure=info["failure"])


def _report(notify: Notify | None, level: str, message: str, event: str, **fields: Any) -> None:
    getattr(log, level)(event, message=message, **fields)
    print(message, file=sys.stderr)
    if notify is not None:
        notify(level, message)
