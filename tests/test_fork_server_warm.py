"""A sandbox worker starts its sandbox fork server as it starts (uni_agent.worker_preload), and its sandboxes then
use that one; no fork server is warmed where none would serve, nor on a GPU worker."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from uni_agent import worker_preload
from uni_agent.bench.sandbox_rtt import built, deployment
from uni_agent.driver.cluster import cluster_client
from uni_agent.sandbox import fork_server
from uni_agent.sandbox.local import LocalDeploymentConfig, warm_fork_server
from uni_agent.settings import load_settings


def live_fork_servers() -> set[str]:
    """This process's live fork servers, by key (also run on the workers)."""
    from uni_agent.sandbox import fork_server

    return {str(key) for key, server in fork_server._fork_servers.items() if server.alive}


def test_each_worker_of_a_runs_cluster_has_its_fork_server_before_any_sandbox():
    async def scenario():
        async with cluster_client(load_settings(local_workers=2, dashboard=False)) as client:
            deadline = time.monotonic() + 20
            while True:
                counts = [len(keys) for keys in (await client.run(live_fork_servers)).values()]
                if counts == [1, 1] or time.monotonic() > deadline:
                    return counts
                await asyncio.sleep(0.1)

    assert asyncio.run(scenario()) == [1, 1]  # before: none until the worker's first sandbox


def test_the_warmed_fork_server_is_the_one_a_default_sandbox_takes():
    async def scenario():
        assert await warm_fork_server()
        warmed = live_fork_servers()
        box = built(deployment("local", None), "after-warm")
        await box.start()
        try:
            said = await box.exec("echo from the warmed fork server", 30)
        finally:
            await box.close()
        return warmed, live_fork_servers(), said.output

    warmed, after, output = asyncio.run(scenario())
    assert after - warmed == set(), "the sandbox started a fork server of its own: the warm-up's key differs"
    assert "from the warmed fork server" in output


def test_no_fork_server_is_warmed_where_none_would_serve():
    before = live_fork_servers()
    for config in (LocalDeploymentConfig(network=True), LocalDeploymentConfig(launcher="bwrap"),
                   LocalDeploymentConfig(workspace="copy"), LocalDeploymentConfig(mounts={"/etc": "/mnt/etc"})):
        assert asyncio.run(warm_fork_server(config)) is False, config
    assert live_fork_servers() - before == set()


def test_only_sandbox_workers_warm_one_and_the_variable_turns_it_off(monkeypatch):
    assert worker_preload.is_sandbox_worker({"SANDBOX": 1024}) and worker_preload.is_sandbox_worker({})
    assert worker_preload.is_sandbox_worker({"GPU": 8, "SANDBOX": 32})
    assert not worker_preload.is_sandbox_worker({"GPU": 8})
    calls = []

    async def recorded():
        calls.append(True)

    monkeypatch.setattr(worker_preload, "_warm_fork_server", recorded)

    async def preload(resources):
        worker_preload.warm_fork_server_soon(SimpleNamespace(state=SimpleNamespace(total_resources=resources)))
        await asyncio.sleep(0)  # the warm-up task's first step

    asyncio.run(preload({"GPU": 8}))
    assert calls == []
    monkeypatch.setenv(worker_preload.WARM_FORK_SERVER, "0")
    asyncio.run(preload({"SANDBOX": 4}))
    assert calls == []
    monkeypatch.delenv(worker_preload.WARM_FORK_SERVER)
    asyncio.run(preload({"SANDBOX": 4}))
    assert calls == [True]
    assert fork_server.FORK_SERVER_IDLE_S > 0  # a warmed fork server no run uses ends like any idle one


def test_the_warm_ups_quiet_probe_is_reused_and_the_first_sandbox_says_what_is_missing(monkeypatch, tmp_path):
    """The warm-up probes for a pids cgroup quietly; the first sandbox's call reuses that probe (not a second one on
    its path) and says once that there is none."""
    from structlog.testing import capture_logs

    from uni_agent.sandbox import process_limit

    monkeypatch.setenv("UNI_AGENT_PIDS_CGROUP", str(tmp_path / "no-cgroup-mounted-here"))
    process_limit.probed_pids_cgroup_parent.cache_clear()
    process_limit._say_no_pids_cgroup.cache_clear()
    try:
        with capture_logs() as logs:
            assert process_limit.pids_cgroup_parent(quiet=True) is None
            assert logs == []
            assert process_limit.pids_cgroup_parent() is None
            assert process_limit.pids_cgroup_parent() is None
        assert [entry["event"] for entry in logs] == ["no_pids_cgroup"]
        assert process_limit.probed_pids_cgroup_parent.cache_info().misses == 1
    finally:
        process_limit.probed_pids_cgroup_parent.cache_clear()
        process_limit._say_no_pids_cgroup.cache_clear()
