"""uni-agent's worker extension, loaded with `dask worker --preload uni_agent.worker_preload`.

It imports what an agent worker's rollouts run on (the AgentWorker actor, our agent loop, the local sandbox, the
tools) when the dask worker starts. Without it the first run on a fresh worker pays for those imports when its actors
start and its first sandboxes open, while every rollout of the first wave waits (0.4 s of one core per worker here,
more when the workers of a node import at once). It also closes the worker's own HTTP server, which answers any user
of the node (uni_agent.dashboard.guard.stop_worker_pages), stops Dask's profiler's sampling of the agents' event
loop (uni_agent.dask_profiler) and makes Dask's system monitor sample every 2 s (uni_agent.worker_monitor). On a
sandbox worker it starts the worker's sandbox fork server as the worker starts (uni_agent.sandbox.local's
warm_fork_server), not with the first wave's first sandbox while the rest of that wave's sandboxes on the worker
wait. A run's own LocalCluster and the SLURM recipes load it.
Without it everything is imported on first use, and the worker's /metrics stays open to the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
import signal
from typing import Any

from .dashboard.guard import stop_worker_pages
from .dask_profiler import stop_worker_profiler
from .logs import heartbeat_failures_in_one_line, keep_strangers_off_console
from .worker_monitor import slow_worker_monitor
from .worker_resources import SANDBOX

from .driver.interrupt import DRIVER_STOPS_ME

# The modules the first rollout on a worker would import. Harness agents (uni_agent.harness) are left to first use:
# few runs use them.
MODULES = (
    "uni_agent.episode.worker",
    "uni_agent.episode.agent_loop",
    "uni_agent.sandbox.local",
    "uni_agent.sandbox.start",
    "uni_agent.tools.toolbox",
    "uni_agent.grading",
)


WARM_FORK_SERVER = "UNI_AGENT_WARM_FORK_SERVER"  # "0": a worker's fork server starts with its first sandbox instead
_warming: set[asyncio.Task] = set()  # the running warm-up, kept from the garbage collector


def import_rollout_modules() -> None:
    for name in MODULES:
        importlib.import_module(name)


def dask_setup(worker: Any) -> None:
    keep_strangers_off_console()  # another user's connection attempts on this worker's ports: not on the console
    heartbeat_failures_in_one_line()  # a cluster's close meeting a heartbeat on its way: no traceback on the console
    stop_worker_pages(worker)  # Dask's per-worker /metrics, /health: readable by any user of the node, used by none
    stop_worker_profiler(worker)  # 100 samples a second on the agents' event loop (uni_agent.dask_profiler)
    slow_worker_monitor(worker)  # its open files counted twice a second (uni_agent.worker_monitor)
    if os.environ.get(DRIVER_STOPS_ME) == "1":
        with contextlib.suppress(ValueError):  # not the main thread: leave SIGINT as it is
            signal.signal(signal.SIGINT, signal.SIG_IGN)
    import_rollout_modules()
    warm_fork_server_soon(worker)


def is_sandbox_worker(resources: dict[str, float]) -> bool:
    """A worker that declares SANDBOX, or one that declares no resource at all (a GPU worker declares its GPUs). The
    driver also takes a worker with other resources but no GPUs where none declares SANDBOX
    (uni_agent.driver.cluster.sandbox_workers): such a worker's first sandbox starts its fork server, as before."""
    return SANDBOX in resources or not resources


def warm_fork_server_soon(worker: Any) -> None:
    """On a sandbox worker, the fork server's boot and probe (and the overlay probe) start now, on the worker's event
    loop, while the worker joins its cluster."""
    if os.environ.get(WARM_FORK_SERVER) == "0" or not is_sandbox_worker(dict(worker.state.total_resources)):
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop here (not Dask's own preload call): the first sandbox starts it
        return
    task = loop.create_task(_warm_fork_server())
    _warming.add(task)
    task.add_done_callback(_warming.discard)


async def _warm_fork_server() -> None:
    from .sandbox.local import warm_fork_server

    try:
        await warm_fork_server()
    except Exception as exc:  # the worker's first sandbox starts one, and says what fails there
        logging.getLogger(__name__).debug("fork server warm-up failed: %s: %s", type(exc).__name__, exc)
