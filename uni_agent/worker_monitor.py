"""How often an agent worker samples itself for Dask's charts: every 2 s instead of Dask's 0.5 s.

Every Dask server runs a SystemMonitor on its event loop (the one the agent loops run on). Each sample counts the
process's open files (`psutil.Process.num_fds` lists /proc/PID/fd), which grows with the rollouts in flight: 4.7 ms a
sample at 8,000 open files. At 4,000 simulated rollouts in one worker the workers' CPU fell 9.6 -> 9.3 s with 2 s
(`uni-agent bench --simulate --in-flight 4000 --workers 1 --endpoint-processes 1 --waves 1 --baseline REF`, 2 cores).
The dashboard's worker charts and the heartbeat's figures read the latest sample, so one every 2 s shows the same
picture, later by at most 2 s; the worker's memory limits read the process's memory on their own.

The worker preload (uni_agent.worker_preload) sets it; a slower interval in the user's Dask config stays.
"""

from __future__ import annotations

from typing import Any

MONITOR_INTERVAL_MS = 2000
MONITOR_CALLBACK = "monitor"  # distributed.core.Server.periodic_callbacks: SystemMonitor.update


def slow_worker_monitor(worker: Any) -> None:
    """From a worker preload's dask_setup, which runs before the worker starts its periodic callbacks."""
    from tornado.ioloop import PeriodicCallback

    current = worker.periodic_callbacks.get(MONITOR_CALLBACK)
    if current is None or current.callback_time >= MONITOR_INTERVAL_MS:
        return
    current.stop()  # not started yet; stopped in case a later Dask starts it earlier
    worker.periodic_callbacks[MONITOR_CALLBACK] = PeriodicCallback(worker.monitor.update, MONITOR_INTERVAL_MS)
