"""Dask's event-loop tick, memory and system monitors and the workers' heartbeats are slower in a run's processes
(uni_agent.dask_timers), and a slower setting of the user's own stays."""

from __future__ import annotations

import asyncio
import time

import dask

from uni_agent.dask_timers import (HEARTBEAT_FLOOR_S, IN_ENVIRONMENT, INTERVALS, dask_config, environment,
                                   slow_heartbeats)
from uni_agent.driver.cluster import cluster_client
from uni_agent.settings import load_settings


def timers(dask_worker) -> tuple[float, float | None, float]:
    """A Dask server's tick, memory-monitor (none: None) and system-monitor callbacks, in ms. Also for a nanny and
    the scheduler."""
    callbacks = dask_worker.periodic_callbacks
    monitor = callbacks.get("memory_monitor")
    return callbacks["tick"].callback_time, None if monitor is None else monitor.callback_time, \
        callbacks["monitor"].callback_time


def heartbeat_ms(dask_worker) -> float:
    return dask_worker.periodic_callbacks["heartbeat"].callback_time


async def heartbeat_after_the_first_reply(client) -> list[float]:
    """Each worker's heartbeat interval once the scheduler answered one (the reply sets it; a worker starts at 1 s)."""
    deadline = time.monotonic() + 20
    while True:
        intervals = list((await client.run(heartbeat_ms)).values())
        if all(ms != 1000 for ms in intervals) or time.monotonic() > deadline:
            return intervals
        await asyncio.sleep(0.2)


def test_a_runs_local_cluster_runs_its_timers_slower_and_its_workers_heartbeat_every_2_s():
    async def scenario():
        async with cluster_client(load_settings(local_workers=1, dashboard=False)) as client:
            workers = list((await client.run(timers)).values())
            nannies = list((await client.run(timers, nanny=True)).values())
            scheduler = await client.run_on_scheduler(lambda dask_scheduler: timers(dask_scheduler))
            return workers, nannies, scheduler, await heartbeat_after_the_first_reply(client)

    workers, nannies, scheduler, heartbeats = asyncio.run(scenario())
    assert workers == [(200, 500, 2000)] and nannies == [(200, 500, 2000)], (workers, nannies)  # Dask's: 20, 100, 500
    assert scheduler == (200, None, 2000)
    assert heartbeats == [1000 * HEARTBEAT_FLOOR_S]  # Dask asks one worker of a small cluster for one every 500 ms


class FakeScheduler:
    """Only the handlers table slow_heartbeats wraps (the real scheduler's is tested above)."""

    def __init__(self, interval: float):
        self.handlers = {"heartbeat_worker": lambda *, address: {"status": "OK", "heartbeat-interval": interval}}


def test_the_heartbeat_floor_keeps_a_slower_interval_and_is_installed_once():
    fast, slow = FakeScheduler(0.5), FakeScheduler(6.0)  # Dask's for 1 worker; for 1,000 workers
    for scheduler in (fast, slow):
        slow_heartbeats(scheduler)
        slow_heartbeats(scheduler)  # a second preload: not wrapped twice
    assert fast.handlers["heartbeat_worker"](address="w")["heartbeat-interval"] == HEARTBEAT_FLOOR_S
    assert slow.handlers["heartbeat_worker"](address="w")["heartbeat-interval"] == 6.0
    assert not hasattr(fast.handlers["heartbeat_worker"].__wrapped__, "__wrapped__")


def test_only_an_interval_faster_than_ours_is_changed():
    with dask.config.set({"distributed.admin.tick.interval": "20ms",
                          "distributed.worker.memory.monitor-interval": "100ms",
                          "distributed.admin.system-monitor.interval": "500ms"}):  # Dask's defaults
        assert dask_config() == INTERVALS
    with dask.config.set({"distributed.admin.tick.interval": "1s", "distributed.admin.system-monitor.interval": "5s",
                          "distributed.worker.memory.monitor-interval": 0.2}):  # the user's, two slower, one faster
        assert dask_config() == {"distributed.worker.memory.monitor-interval": "500ms"}


def test_an_environment_that_sets_an_interval_keeps_it():
    tick = "DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL"
    assert IN_ENVIRONMENT == {tick: "200ms", "DASK_DISTRIBUTED__WORKER__MEMORY__MONITOR_INTERVAL": "500ms",
                              "DASK_DISTRIBUTED__ADMIN__SYSTEM_MONITOR__INTERVAL": "2s"}  # cluster/*.sbatch say them
    assert environment({}) == IN_ENVIRONMENT
    assert environment({tick: "50ms"}) == {k: v for k, v in IN_ENVIRONMENT.items() if k != tick}
