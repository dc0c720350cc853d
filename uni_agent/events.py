"""Rollout state events: what the dashboard and metrics are built from.

Every rollout moves through queued → starting_sandbox → running (turn k of max) → verifying → done | failed.
Each change is one msgpack-able dict logged to the Dask scheduler under TOPIC (`log_event`), from the driver or
from the worker running the rollout; a scheduler plugin folds them into live state. Emitting never raises: a lost
event must not fail a rollout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import structlog

from .current_worker import current_worker

TOPIC = "uni-agent"
STATES = ("queued", "starting_sandbox", "running", "verifying", "done", "failed")
MAX_TRAJECTORY_CHARS = 200_000  # the detail view's copy; the full trajectory is in the Parquet results

Emit = Callable[[dict[str, Any]], None]
log = structlog.get_logger("uni_agent.events")


def rollout_event(run_id: str, instance_id: str, rollout: int, state: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "rollout", "run_id": run_id, "instance_id": instance_id, "rollout": rollout, "state": state,
            "t": time.time(), **fields}


def notice_event(run_id: str, level: str, message: str) -> dict[str, Any]:
    """A run-level message for the page (an engine that crashed and came back, results that cannot be written):
    not a rollout's state, shown as it is, newest first."""
    return {"kind": "notice", "run_id": run_id, "level": level, "message": message, "t": time.time()}


def batch_event(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Many events as one message: the driver queues a whole run at its start in a few round trips to the
    scheduler instead of one per rollout (20,000 sequential round trips held every rollout back for seconds)."""
    return {"kind": "batch", "events": events}


def unbatch(msg: Any) -> list[Any]:
    """The events one logged message carries: a batch's events, else the message itself."""
    if isinstance(msg, dict) and msg.get("kind") == "batch" and isinstance(msg.get("events"), list | tuple):
        return list(msg["events"])  # msgpack may hand a list over as a tuple
    return [msg]


def no_emit(_: dict[str, Any]) -> None:
    return None


def worker_emitter() -> Emit:
    """Events from inside a Dask worker (an actor's rollout), or nothing outside one."""
    worker = current_worker()
    if worker is None:
        return no_emit

    def emit(msg: dict[str, Any]) -> None:
        try:
            worker.log_event(TOPIC, msg)
        except Exception as exc:  # never let observability break a rollout
            log.warning("event_dropped", error=repr(exc))

    return emit
