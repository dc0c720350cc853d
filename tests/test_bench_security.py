"""The bench's clusters are guarded as a run's: users run `uni-agent bench` on shared nodes too, and a Dask scheduler
without credentials runs whatever any local user's client sends it, as the bench's user.

Before: the simulation's `dask scheduler` and workers spoke plain tcp (any user of the node could `client.run` code
as the bench's user), the gateway sweep's LocalCluster too, and the sweep's LocalCluster served its dashboard pages
to anyone and kept its scratch under Dask's shared default. Real scheduler and worker processes here; the stranger's
attempts are tests/stranger.py's (plain tcp, TLS without a certificate, TLS with credentials of its own, a Client that
would run code).
"""

from __future__ import annotations

import asyncio
import os
import stat
import urllib.error
import urllib.request
from pathlib import Path

import dask
from distributed import Client, LocalCluster

from stranger import attempts, got_in
from uni_agent.bench.simulate_processes import ProcessCluster
from uni_agent.dashboard import page_token
from uni_agent.driver.cluster import local_cluster_config, local_cluster_options
from uni_agent.private_dirs import dask_dir


def _status(url: str, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def _strangers_report(addresses: list[str]) -> dict[str, dict[str, str]]:
    async def each() -> dict[str, dict[str, str]]:
        return {address: await attempts(address) for address in addresses}

    return asyncio.run(each())


def _pages_need_the_token(client: Client, dashboard: str) -> None:
    page = f"{dashboard}/json/identity.json"
    assert _status(page) in (401, 403), page
    assert _status(page, client.run_on_scheduler(page_token)) == 200  # the control: the page is there, for its token


def test_the_simulations_cluster_takes_only_its_own_credentials(tmp_path):
    with ProcessCluster(1, tmp_path / "cluster", dict(os.environ)) as cluster:
        client = cluster.client
        addresses = [client.scheduler.address, *client.scheduler_info(n_workers=-1)["workers"]]
        assert len(addresses) == 2 and all(a.startswith("tls://") for a in addresses), addresses
        report = _strangers_report(addresses)
        assert not got_in(report), report
        assert client.submit(os.getpid, pure=False).result() != os.getpid()  # its own client works, on a worker
        _pages_need_the_token(client, cluster.dashboard)
        assert stat.S_IMODE(cluster.tls_dir.stat().st_mode) == 0o700
        # the driver joins with the same credentials (the tls_dir setting), and Dask's scratch is ours
        assert cluster.env["UNI_AGENT_TLS_DIR"] == str(cluster.tls_dir)
        local = client.run(lambda dask_worker: dask_worker.local_directory)
        assert all(Path(d).is_relative_to(dask_dir()) for d in local.values()), local


def test_the_sweeps_local_cluster_is_guarded_as_a_runs():
    """What uni_agent.bench.ours and .gateway start their LocalCluster with (a run's own arguments)."""
    with dask.config.set(local_cluster_config()), \
            LocalCluster(**local_cluster_options(1, 1, "127.0.0.1:0")) as cluster, Client(cluster) as client:
        addresses = [client.scheduler.address, *client.scheduler_info(n_workers=-1)["workers"]]
        report = _strangers_report(addresses)
        assert not got_in(report), report
        port = client.scheduler_info()["services"]["dashboard"]
        _pages_need_the_token(client, f"http://127.0.0.1:{port}")
        local = client.run(lambda dask_worker: dask_worker.local_directory)
        assert all(Path(d).is_relative_to(dask_dir()) for d in local.values()), local
