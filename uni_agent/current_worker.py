"""The Dask worker this code runs in, if any: its address names where a rollout or an engine replica ran.

A leaf module (it imports nothing of uni_agent), so that the worker, the engines and the events all may use it."""

from __future__ import annotations

from typing import Any


def current_worker() -> Any | None:
    """The distributed.Worker running this code, or None outside one (the driver, a test, a plain script)."""
    try:
        from distributed import get_worker

        return get_worker()
    except ValueError:
        return None


def worker_address() -> str:
    """This worker's address, or "local" outside a Dask worker."""
    worker = current_worker()
    return worker.address if worker is not None else "local"
