"""Rollout state events: what the dashboard and metrics are built from.

Every rollout moves through queued → starting_sandbox → running (turn k of max) → verifying → done | failed.
Each change is one msgpack-able dict logged to the Dask scheduler under TOPIC (`log_event`), from the driver or
from the worker running the rollout; a scheduler plugin folds them into live state. Emitting never raises: a lost
event must not fail a rollout.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import structlog

from .current_worker import current_worker

TOPIC = "uni-agent"


class RolloutState(StrEnum):
    """Where a rollout is; its value is the event's `state` string."""

    QUEUED = "queued"
    STARTING_SANDBOX = "starting_sandbox"
    RUNNING = "running"  # turn k of max
    VERIFYING = "verifying"
    DONE = "done"
    FAILED = "failed"


STATES: tuple[str, ...] = tuple(state.value for state in RolloutState)
MAX_TRAJECTORY_CHARS = 200_000  # the detail view's copy; the full trajectory is in the Parquet results
PAGE_TRAJECTORIES = 1000  # the page holds the trajectories of the latest this many finished rollouts
TRAJECTORY_FIELDS = ("messages", "verification")  # what a finished rollout's event carries for the detail view
TURN_EVENTS_HOLD_S = 0.25  # how long a worker holds turn events to send them as one batch

Emit = Callable[[dict[str, Any]], None]
log = structlog.get_logger("uni_agent.events")


_PLAIN_TYPES = frozenset({str, int, float, bool, type(None)})


def plain_value(value: Any) -> Any:
    """`value` as a plain msgpack type: an enum as its string, a numpy scalar as its Python number, anything else
    as its str. Events go to the scheduler without Dask's per-message check (uni_agent.driver.progress), so
    nothing else may reach it (Dask's protocol would pickle it)."""
    if type(value) in _PLAIN_TYPES:
        return value
    if isinstance(value, StrEnum):
        return value.value
    for plain in (bool, int, float, str):  # subclasses: numpy.float64 is a float
        if isinstance(value, plain):
            return plain(value)
    item = getattr(value, "item", None)  # numpy.int64, numpy.bool_
    if callable(item):
        with contextlib.suppress(Exception):
            if type(number := item()) in _PLAIN_TYPES:
                return number
    return str(value)


def rollout_event(run_id: str, instance_id: str, rollout: int, state: RolloutState, **fields: Any) -> dict[str, Any]:
    """One state change; every value a plain msgpack type (plain_value)."""
    fields = {k: plain_value(v) for k, v in fields.items()}
    return {"kind": "rollout", "run_id": run_id, "instance_id": instance_id, "rollout": rollout,
            "state": RolloutState(state).value, "t": time.time(), **fields}


def notice_event(run_id: str, level: str, message: str) -> dict[str, Any]:
    """A run-level message for the page (an engine that crashed and came back, results that cannot be written):
    not a rollout's state, shown as it is, newest first."""
    return {"kind": "notice", "run_id": run_id, "level": level, "message": message, "t": time.time()}


def batch_event(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Many events as one message: the driver queues a whole run at its start in a few round trips to the
    scheduler instead of one per rollout (20,000 sequential round trips held every rollout back for seconds)."""
    return {"kind": "batch", "events": events}


def trim_trajectories(events: list[dict[str, Any]], keep: int = PAGE_TRAJECTORIES) -> int:
    """Of the finished rollouts' events in `events` (in the order they will be sent), only the last `keep` carry
    their trajectory; the earlier ones are marked `trajectory: evicted` instead. The page holds the latest `keep`
    trajectories, so those would be evicted as soon as the later ones arrived: what the page shows is the same, and
    at 100,000 in flight a wave's end no longer sends (and the scheduler no longer folds and keeps in its event log)
    tens of thousands of trajectories to drop them. Returns how many were trimmed."""
    carried = 0
    trimmed = 0
    for event in reversed(events):
        if not any(field in event for field in TRAJECTORY_FIELDS):
            continue
        carried += 1
        if carried > keep:
            for field in TRAJECTORY_FIELDS:
                event.pop(field, None)
            event["trajectory"] = "evicted"
            trimmed += 1
    return trimmed


def unbatch(msg: Any) -> list[Any]:
    """The events one logged message carries: a batch's events, else the message itself."""
    if isinstance(msg, dict) and msg.get("kind") == "batch" and isinstance(msg.get("events"), list | tuple):
        return list(msg["events"])  # msgpack may hand a list over as a tuple
    return [msg]


def no_emit(_: dict[str, Any]) -> None:
    return None


def worker_emitter(hold_s: float = TURN_EVENTS_HOLD_S) -> WorkerEvents:
    """Events from inside a Dask worker (an actor's rollout), or nothing outside one."""
    return WorkerEvents(current_worker(), hold_s)


class WorkerEvents:
    """An Emit for a worker. A turn's `running` event waits up to `hold_s` on the worker's event loop and goes with
    the others of that moment as one batch: one per turn of every rollout was most of the scheduler's work in a run.
    Any other event goes at once, after those held, and `flush` (the worker calls it when a rollout ends, before the
    driver hears of it) sends what is held, so each rollout's events still reach the scheduler in order."""

    def __init__(self, worker: Any, hold_s: float):
        self.worker, self.hold_s = worker, hold_s
        self.held: list[dict[str, Any]] = []

    def __call__(self, msg: dict[str, Any]) -> None:
        if self.worker is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop (a thread): nothing to hold it on
            loop = None
        self.held.append(msg)
        if loop is None or msg.get("state") != RolloutState.RUNNING:
            self.flush()  # with what is held before it, as one message
        elif len(self.held) == 1:
            loop.call_later(self.hold_s, self.flush)

    def flush(self) -> None:
        events = self.held[:]
        self.held.clear()
        self._send(events)

    def _send(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return
        try:
            self.worker.log_event(TOPIC, events[0] if len(events) == 1 else batch_event(events))
        except Exception as exc:  # never let observability break a rollout
            log.warning("event_dropped", error=repr(exc), events=len(events))
