"""The cluster a run uses, and which of its workers take agents and sandboxes.

`cluster_client` connects to a running scheduler (by address or scheduler file; SLURM jobs may still be queued, so it
waits for workers) or starts a LocalCluster on this machine, and prints where to watch. Either way over TLS: the
LocalCluster with credentials that exist only in its processes, a scheduler started apart with the files of the
tls_dir setting (uni_agent.driver.tls). Sandbox workers are those that declare a SANDBOX resource, else those that
declare no GPUs; verification futures go there too. Where engine replicas
run on the GPU workers is uni_agent.engines.placement.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import dask
from distributed import Client, LocalCluster

from ..dashboard import page_access, page_url, stop_pages, tunnel_friendly, with_token
from ..dask_profiler import dask_config
from ..dask_timers import CLUSTER_INFO_SYNC_S
from ..dask_timers import dask_config as timers_config
from ..private_dirs import dask_dir
from ..settings import RunSettings
from ..worker_resources import SANDBOX
from .interrupt import DRIVER_STOPS_ME
from .tls import client_security, local_security, scheduler_file_address

LOCAL_SANDBOXES = 1024  # what a LocalCluster's workers declare: the agents' concurrency is the real bound
WORKER_PRELOAD = "uni_agent.worker_preload"  # dask worker --preload: a worker imports the rollouts' modules at start
# dask scheduler --preload: the GPU lease table and the page guard from the scheduler's start, before it serves a page
SCHEDULER_PRELOAD = "uni_agent.scheduler_preload"


@contextlib.asynccontextmanager
async def cluster_client(settings: RunSettings, scheduler_address: str | None = None,
                         security: Any = None) -> AsyncIterator[Client]:
    """An asynchronous Client of the scheduler given (argument, then settings), else of a new LocalCluster.
    `security`: the credentials of the given scheduler's client (run(client=...)), else those of tls_dir."""
    address = scheduler_address or settings.scheduler_address
    if address or settings.scheduler_file:
        if not address:
            address = await scheduler_file_address(settings.scheduler_file)
        if security is None or not address.startswith("tls://"):  # a tls:// client brings its own credentials
            security = client_security(address, settings.tls_dir)
        async with Client(address, asynchronous=True, security=security) as client:
            await wait_for_workers(client, settings.worker_wait_timeout, gpu_resource=settings.gpu_resource_name,
                                   gpus=gpus_needed(settings))
            await print_pages(client)
            yield client
        return
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(dask.config.set(local_cluster_config()))
        cluster = await stack.enter_async_context(LocalCluster(
            **local_cluster_options(local_worker_count(settings), settings.threads_per_worker,
                                    "127.0.0.1:8787" if settings.dashboard else None),
            asynchronous=True))
        if settings.engine == "vllm":  # this machine's GPUs as one GPU worker, apart from the sandbox workers
            from distributed import Nanny

            await stack.enter_async_context(Nanny(
                cluster.scheduler_address, nthreads=1, name="gpu-0", host="127.0.0.1", protocol="tls://",
                security=cluster.security, dashboard_address="127.0.0.1:0", preload=[WORKER_PRELOAD],
                resources={settings.gpu_resource_name: settings.n_gpus_per_node}))
        client = await stack.enter_async_context(Client(cluster, asynchronous=True))
        await print_pages(client, serve=settings.dashboard)
        yield client


def local_cluster_config() -> dict[str, Any]:
    """The dask.config a LocalCluster of ours starts under (a run's, the bench's). Every Dask server (the scheduler in
    this process, the nannies, the workers) puts its scratch dir on sys.path, and Dask's default
    (/tmp/dask-scratch-space) may be another user's: ours, 0700, instead. Dask's profiler off
    (uni_agent.dask_profiler), its event-loop tick and memory monitor slower (uni_agent.dask_timers): the nannies pass
    this config to the workers."""
    return {"temporary-directory": str(dask_dir()), **dask_config(), **timers_config()}


def local_cluster_options(n_workers: int, threads_per_worker: int, dashboard_address: str | None) -> dict[str, Any]:
    """LocalCluster's arguments for a cluster that no other user of the machine can use: loopback only, and TLS even
    there (every user of this machine can reach 127.0.0.1, and a scheduler runs what any client sends it); its pages
    guarded by a token from the scheduler's start (the scheduler preload). A run's and the bench's clusters alike."""
    return dict(
        n_workers=n_workers, threads_per_worker=threads_per_worker, processes=True, host="127.0.0.1",
        protocol="tls://", security=local_security(), dashboard_address=dashboard_address,
        resources={SANDBOX: LOCAL_SANDBOXES},
        preload=[WORKER_PRELOAD],  # the rollouts' imports while the workers start, not in the first wave
        local_directory=str(dask_dir()),
        env={DRIVER_STOPS_ME: "1"},  # a Ctrl-C is the driver's to handle, not the workers'
        scheduler_kwargs={"preload": [SCHEDULER_PRELOAD]},
        scheduler_sync_interval=CLUSTER_INFO_SYNC_S,  # its description on the scheduler: unchanged while a run lasts
    )


def local_worker_count(settings: RunSettings) -> int:
    """settings.local_workers, or for 0 one per 2 CPUs this process may use, 2 to 16: each worker process runs its
    rollouts' agent loops on one event loop, and 1,024 rollouts on 16 cores did best with 8 (docs/benchmarks.md)."""
    if settings.local_workers:
        return settings.local_workers
    return min(16, max(2, len(os.sched_getaffinity(0)) // 2))


async def print_pages(client: Client, serve: bool = True) -> None:
    """Where to watch: Dask's dashboard and the uni-agent page next to it (any scheduler: local, file, address), each
    address with the token its pages ask for (uni_agent.dashboard.guard), fetched over the authenticated comm; the
    scheduler guards its pages now if nothing did before. serve=False (the run's LocalCluster with the dashboard
    setting off): the scheduler's HTTP server stops listening instead."""
    if not serve:
        await client.run_on_scheduler(stop_pages)
        print("dask dashboard and uni-agent page: off (the dashboard setting is false)", file=sys.stderr)
        return
    link = client.dashboard_link
    if not link:
        print("uni-agent page: none (the scheduler serves no dashboard; start it without --no-dashboard)",
              file=sys.stderr)
        return
    token, bound, port = await client.run_on_scheduler(page_access)
    link = tunnel_friendly(link, bound, port)
    print(f"dask dashboard: {with_token(link, token)}", file=sys.stderr)
    print(f"uni-agent page: {with_token(page_url(link), token)}", file=sys.stderr)


def gpus_needed(settings: RunSettings) -> int:
    """GPUs the engines will be placed on: vLLM's, and llama.cpp's when engine_device says gpu (with `auto` the
    engine goes where the GPUs are, so none are waited for)."""
    on_gpus = settings.engine == "vllm" or (settings.engine == "llama_cpp" and settings.engine_device == "gpu")
    return settings.nnodes * settings.n_gpus_per_node if on_gpus else 0


async def wait_for_workers(client: Any, timeout: float, *, gpu_resource: str, gpus: int = 0) -> None:
    """On a cluster started apart, wait until a worker can take sandboxes (it declares SANDBOX, or no GPUs) and the
    GPU workers declare `gpus` GPUs, or `timeout` seconds; then placement names whatever is still missing."""
    deadline = time.monotonic() + timeout
    said = ""
    while True:
        info = (await client.scheduler.identity(n_workers=-1))["workers"]
        resources = [w.get("resources") or {} for w in info.values()]
        have_gpus = sum(float(r.get(gpu_resource, 0)) for r in resources)
        sandbox = sum(SANDBOX in r or gpu_resource not in r for r in resources)
        if (sandbox and have_gpus >= gpus) or time.monotonic() > deadline:
            return
        status = f"{sandbox} for sandboxes" + (f", {have_gpus:g} of {gpus} GPUs" if gpus else "")
        if status != said:
            print(f"waiting up to {timeout:g}s for dask workers: {status}", file=sys.stderr)
            said = status
        await asyncio.sleep(1)


async def live_workers(client: Client) -> set[str]:
    """The addresses of the workers the scheduler knows now."""
    return set((await client.scheduler.identity(n_workers=-1))["workers"])


async def sandbox_workers(client: Client, gpu_resource: str) -> list[str]:
    """Workers that declare a SANDBOX resource; when none does, every worker that declares no `gpu_resource`. Agents
    and sandboxes go to a GPU worker only when it also declares SANDBOX (`--resources GPU=8,SANDBOX=32`)."""
    info = (await client.scheduler.identity(n_workers=-1))["workers"]
    tagged = sorted(addr for addr, w in info.items() if SANDBOX in (w.get("resources") or {}))
    untagged = sorted(addr for addr, w in info.items() if gpu_resource not in (w.get("resources") or {}))
    if tagged or untagged:
        return tagged or untagged
    raise RuntimeError(f"no dask worker can take agents and sandboxes ({len(info)} connected, all GPU workers): "
                       "start CPU workers with `dask worker --resources SANDBOX=N` (or declare SANDBOX=N on GPU workers)")


async def verification_placement(client: Client, workers: list[str]) -> dict[str, Any]:
    """Where verification futures go (keyword arguments of client.submit): by the SANDBOX resource where workers
    declare it (which also caps how many run at once per worker), else pinned to the sandbox workers. Asking for a
    resource no worker has would wait forever."""
    info = (await client.scheduler.identity(n_workers=-1))["workers"]
    if any(SANDBOX in (info[addr].get("resources") or {}) for addr in workers if addr in info):
        return {"resources": {SANDBOX: 1}}
    return {"workers": workers, "allow_other_workers": False}
