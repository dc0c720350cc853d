"""Dask's event-loop tick and memory monitor are slower in a run's processes (uni_agent.dask_timers), and a slower
setting of the user's own stays."""

from __future__ import annotations

import asyncio

import dask

from uni_agent.dask_timers import IN_ENVIRONMENT, INTERVALS, dask_config, environment
from uni_agent.driver.cluster import cluster_client
from uni_agent.settings import load_settings


def timers(dask_worker) -> tuple[float, float | None]:
    """A Dask server's tick and memory-monitor callbacks, in ms (no memory monitor: None). Also for a nanny."""
    callbacks = dask_worker.periodic_callbacks
    monitor = callbacks.get("memory_monitor")
    return callbacks["tick"].callback_time, None if monitor is None else monitor.callback_time


def test_a_runs_local_cluster_ticks_every_200_ms_and_reads_its_memory_every_500_ms():
    async def scenario():
        async with cluster_client(load_settings(local_workers=1, dashboard=False)) as client:
            workers = list((await client.run(timers)).values())
            nannies = list((await client.run(timers, nanny=True)).values())
            scheduler = await client.run_on_scheduler(lambda dask_scheduler: timers(dask_scheduler)[0])
            return workers, nannies, scheduler

    workers, nannies, scheduler = asyncio.run(scenario())
    assert workers == [(200, 500)] and nannies == [(200, 500)], (workers, nannies)  # Dask's own: 20 and 100
    assert scheduler == 200


def test_only_an_interval_faster_than_ours_is_changed():
    with dask.config.set({"distributed.admin.tick.interval": "20ms",
                          "distributed.worker.memory.monitor-interval": "100ms"}):  # Dask's defaults
        assert dask_config() == INTERVALS
    with dask.config.set({"distributed.admin.tick.interval": "1s",
                          "distributed.worker.memory.monitor-interval": 0.2}):  # the user's, one slower one faster
        assert dask_config() == {"distributed.worker.memory.monitor-interval": "500ms"}


def test_an_environment_that_sets_an_interval_keeps_it():
    tick = "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"
    assert IN_ENVIRONMENT == {tick: "200ms", "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "500ms"}  # *.sbatch
    assert environment({}) == IN_ENVIRONMENT
    assert environment({tick: "50ms"}) == {k: v for k, v in IN_ENVIRONMENT.items() if k != tick}
