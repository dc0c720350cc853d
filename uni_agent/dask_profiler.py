"""Dask's statistical profiler, off in a run's processes unless UNI_AGENT_DASK_PROFILER=1.

Dask samples every worker 100 times a second for the dashboard's Profile page: a callback on the worker's event loop
(the one the agent loops run on), and on Python other than 3.11 a thread per Dask server that walks the event loop's
stack. Our rollouts are coroutines on that loop, not tasks in threads, so the page has little to show for them, and
on 2 cores the callback alone cost 0.26 ms of worker CPU per turn (1.79/1.74 -> 1.53/1.48 ms, `uni-agent bench
--concurrency 64 --workers 1`, two pairs). Set UNI_AGENT_DASK_PROFILER=1 to keep Dask's own setting instead.

Off is set where each process reads its Dask config: the LocalCluster's and launch_jobqueue's scheduler (their
processes pass it to the workers they start) and the SLURM job scripts (an environment variable). A worker started
any other way with `--preload uni_agent.worker_preload` loses the worker's callbacks in the preload.
"""

from __future__ import annotations

import os
from typing import Any

KEEP_PROFILER = "UNI_AGENT_DASK_PROFILER"
PROFILE_CALLBACKS = ("profile", "profile-cycle")  # distributed.Worker.periodic_callbacks that sample and roll up
OFF_IN_ENVIRONMENT = "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False"  # for job scripts (cluster/*.sbatch say it too)


def profiler_kept() -> bool:
    return os.environ.get(KEEP_PROFILER) == "1"


def dask_config() -> dict[str, Any]:
    """For dask.config.set around the servers a run starts: the profiler off, unless kept."""
    return {} if profiler_kept() else {"distributed.worker.profile.enabled": False}


def stop_worker_profiler(worker: Any) -> None:
    """From a worker preload's dask_setup, which runs before the worker starts its periodic callbacks."""
    if not profiler_kept():
        for name in PROFILE_CALLBACKS:
            worker.periodic_callbacks.pop(name, None)
