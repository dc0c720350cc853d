"""Dask's two fastest timers, slower in a run's processes: an idle Dask server woke ~150 times a second.

Every Dask server (the scheduler, each nanny, each worker) measures its event loop every 20 ms
(`distributed.admin.tick.interval`: only for the "event loop was unresponsive" warning, at 3 s, and a dashboard
chart), and every nanny and worker reads its process's memory every 100 ms
(`distributed.worker.memory.monitor-interval`: for the pause, spill and restart thresholds). With nothing to do that
was 0.014-0.018 of a core per process, and 0.003-0.008 with 200 ms and 500 ms (a `dask scheduler` and one
`dask worker`, 30 s each, 2-core VM). A run pays it in every process for its whole length: at 256 rollouts on 2 cores
with 2 workers the framework's CPU per turn fell 2.64 / 2.36 -> 2.28 / 2.08 ms, half of it in the scheduler's
process (where the nannies run). A 200 ms tick still catches every loop Dask warns about; a 500 ms check still
pauses a worker at 80% of its memory limit and restarts it at 95%, at most 0.4 s later than Dask's default.

Three more, for what an idle run still spent (2026-12-07, a run's LocalCluster of 2 workers idle for 25 s, 2-core
VM: the driver's process, scheduler and nannies included, 16.6-19.4 ms of CPU a second, each worker 5.2-10.0):
- every server's system monitor (`distributed.admin.system-monitor.interval`, 500 ms: CPU, memory, network and disk
  counters for the dashboard's charts) every 2 s, as the workers' already was (uni_agent.worker_monitor);
- a worker's heartbeat (its metrics to the scheduler, and the scheduler's word that it still knows the worker) at
  least every HEARTBEAT_FLOOR_S: Dask asks for one every 0.5 s from each of up to 10 workers, 1 s up to 49. Set by
  the scheduler's reply to each heartbeat (slow_heartbeats, from the scheduler preload). A dead worker is still seen
  at once (its comm closes); a hung one after `distributed.scheduler.worker-ttl` (5 minutes), as before;
- the LocalCluster's copy of its own description on the scheduler (CLUSTER_INFO_SYNC_S instead of every second:
  it does not change while the run lasts).

A slower interval in the user's Dask config stays. Set where each process reads its Dask config, as the profiler
setting is (uni_agent.dask_profiler): the LocalCluster's and launch_jobqueue's scheduler (the nannies pass their
config to the workers they start), the SLURM job scripts (environment variables), the simulation's processes.
"""

from __future__ import annotations

import functools
from typing import Any

# Dask's key -> our interval (Dask's defaults: 20ms, 100ms)
INTERVALS = {
    "distributed.admin.tick.interval": "200ms",
    "distributed.worker.memory.monitor-interval": "500ms",
    "distributed.admin.system-monitor.interval": "2s",  # Dask's: 500ms
}
HEARTBEAT_FLOOR_S = 2.0  # Dask's: 0.5 s up to 10 workers, 1 s up to 49, 2 s up to 199, more above
HEARTBEAT_HANDLER = "heartbeat_worker"  # the scheduler's handler whose reply sets the worker's next interval
CLUSTER_INFO_SYNC_S = 10  # LocalCluster(scheduler_sync_interval=...): Dask's 1 s
# the same as Dask reads it from the environment, for job scripts and child processes (cluster/*.sbatch say it too)
IN_ENVIRONMENT = {"DASK_" + key.upper().replace(".", "__").replace("-", "_"): value for key, value in INTERVALS.items()}


def dask_config() -> dict[str, Any]:
    """For dask.config.set around the servers a run starts: each interval the current config has faster than ours."""
    import dask
    from dask.utils import parse_timedelta

    return {key: ours for key, ours in INTERVALS.items()
            if parse_timedelta(dask.config.get(key), default="ms") < parse_timedelta(ours, default="ms")}


def environment(current: dict[str, str]) -> dict[str, str]:
    """The variables to add to an environment (`current`): those it does not set already."""
    return {name: value for name, value in IN_ENVIRONMENT.items() if name not in current}


def slow_heartbeats(scheduler: Any) -> None:
    """From the scheduler preload: each heartbeat's reply asks the worker for its next one in at least
    HEARTBEAT_FLOOR_S (a slower interval Dask asks for, with many workers, stays)."""
    handler = scheduler.handlers[HEARTBEAT_HANDLER]
    if getattr(handler, "heartbeat_floor", None) is not None:
        return  # installed already (a second preload of the same scheduler)

    @functools.wraps(handler)
    def heartbeat_worker(*args: Any, **kwargs: Any) -> Any:
        reply = handler(*args, **kwargs)
        if isinstance(reply, dict) and "heartbeat-interval" in reply:
            reply["heartbeat-interval"] = max(reply["heartbeat-interval"], HEARTBEAT_FLOOR_S)
        return reply

    heartbeat_worker.heartbeat_floor = HEARTBEAT_FLOOR_S  # type: ignore[attr-defined]
    scheduler.handlers[HEARTBEAT_HANDLER] = heartbeat_worker
