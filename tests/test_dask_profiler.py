"""Dask's statistical profiler is off in a run's LocalCluster (uni_agent.dask_profiler), and kept on request."""

from __future__ import annotations

import asyncio

import pytest

from uni_agent.dask_profiler import KEEP_PROFILER
from uni_agent.driver.cluster import cluster_client
from uni_agent.settings import load_settings


def _profiling(dask_worker) -> tuple[list[str], bool]:
    """A worker's sampling callbacks, and the profile setting its process read."""
    import dask

    from uni_agent.dask_profiler import PROFILE_CALLBACKS

    return ([name for name in PROFILE_CALLBACKS if name in dask_worker.periodic_callbacks],
            dask.config.get("distributed.worker.profile.enabled"))


@pytest.mark.parametrize("keep", [False, True], ids=["default", "kept"])
def test_a_runs_local_cluster_samples_its_workers_only_when_asked(keep, monkeypatch):
    if keep:  # the control: Dask's own default, which the test tells apart
        monkeypatch.setenv(KEEP_PROFILER, "1")
    else:
        monkeypatch.delenv(KEEP_PROFILER, raising=False)

    async def scenario():
        async with cluster_client(load_settings(local_workers=1, dashboard=False)) as client:
            return list((await client.run(_profiling)).values())

    (callbacks, enabled), = asyncio.run(scenario())
    if keep:
        assert callbacks == ["profile", "profile-cycle"] and enabled is True
    else:
        assert callbacks == [] and enabled is False
