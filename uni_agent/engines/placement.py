"""Where LLM engine replicas run: which GPU worker, which of its devices.

GPU workers declare their GPUs as a Dask resource (`dask worker --resources GPU=8`). Dask holds an actor's resources
only while its constructor runs, so resources cannot stop two engines from landing on the same GPU. This module keeps
that bookkeeping itself:

* `plan_replicas` (pure) turns the GPU workers, `nnodes`, `n_gpus_per_node` and `tp` into replicas, each with one
  worker and explicit device indices; a replica never spans workers and no device is used twice. Too few GPUs is a
  `PlacementError` before anything starts.
* `GpuLeases`, a scheduler plugin, records which devices the engines of every connected driver hold, so two runs
  sharing one cluster cannot oversubscribe a GPU either. Leases go away with their driver or their worker.
* `place_replicas` / `release_replicas` are the Dask glue the vLLM engine uses.

Device indices are the worker's own (0..GPU-1). The engine gets them as `CUDA_VISIBLE_DEVICES`, mapped through the
worker's own `CUDA_VISIBLE_DEVICES` when it has one (SLURM sets it for `--gres=gpu:N` jobs).

Which workers take agents and sandboxes, and the wait for workers of a cluster started apart, are the driver's:
uni_agent.driver.cluster. This module stays outside the driver because the engines and the scheduler preload use it.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin


class PlacementError(RuntimeError):
    """The engines cannot be placed as asked; nothing was started."""


@dataclass(frozen=True)
class GpuWorker:
    address: str
    host: str
    gpus: int  # the GPU resource the worker declares
    visible: tuple[str, ...] | None = None  # the worker's CUDA_VISIBLE_DEVICES, None when unset
    job: str | None = None  # SLURM_JOB_ID: workers of different jobs never share devices

    def device_ids(self) -> tuple[str, ...]:
        """What each local index 0..gpus-1 is called in CUDA_VISIBLE_DEVICES."""
        if self.visible is None:
            return tuple(str(i) for i in range(self.gpus))
        if len(self.visible) < self.gpus:
            raise PlacementError(
                f"worker {self.address} declares {self.gpus} GPUs but its CUDA_VISIBLE_DEVICES lists only "
                f"{len(self.visible)} ({','.join(self.visible) or 'none'}); fix --resources GPU=N on that worker")
        return self.visible[: self.gpus]


@dataclass(frozen=True)
class Replica:
    index: int
    worker: str
    devices: tuple[int, ...]  # the worker's local GPU indices
    cuda_visible_devices: str  # what the engine process gets


def plan_replicas(
    workers: Iterable[GpuWorker], *, tp: int, nnodes: int, n_gpus_per_node: int,
    busy: Mapping[str, Iterable[int]] | None = None,
) -> list[Replica]:
    """nnodes * n_gpus_per_node / tp replicas, packed worker by worker onto free devices."""
    if tp < 1 or nnodes < 1 or n_gpus_per_node < 1:
        raise PlacementError(f"tp, nnodes and n_gpus_per_node must be >= 1 (got {tp}, {nnodes}, {n_gpus_per_node})")
    if n_gpus_per_node % tp:
        raise PlacementError(f"tp={tp} does not divide n_gpus_per_node={n_gpus_per_node}: a replica's GPUs must all "
                             "be on one node")
    wanted = nnodes * n_gpus_per_node // tp
    workers = sorted((w for w in workers if w.gpus > 0), key=lambda w: (w.host, w.address))
    _check_no_shared_devices(workers)
    busy = {addr: set(devices) for addr, devices in (busy or {}).items()}
    replicas: list[Replica] = []
    free_report = []
    for worker in workers:
        ids = worker.device_ids()
        free = [i for i in range(worker.gpus) if i not in busy.get(worker.address, set())]
        free_report.append(f"{worker.address} ({worker.host}): GPU={worker.gpus}, free {free}")
        # Tensor-parallel groups are consecutive free devices, aligned to tp (GPUs 0-1, 2-3, ... share a switch).
        for start in range(0, worker.gpus - tp + 1, tp):
            group = tuple(range(start, start + tp))
            if len(replicas) == wanted or not set(group) <= set(free):
                continue
            replicas.append(Replica(len(replicas), worker.address, group, ",".join(ids[i] for i in group)))
    if len(replicas) < wanted:
        raise PlacementError(
            f"need {wanted} engine replicas of tp={tp} (nnodes={nnodes} x n_gpus_per_node={n_gpus_per_node} GPUs), "
            f"but only {len(replicas)} fit on the GPU workers: " + ("; ".join(free_report) or
            "there are none (start `dask worker --resources GPU=N` on the GPU nodes)"))
    return replicas


def _check_no_shared_devices(workers: list[GpuWorker]) -> None:
    """Two worker processes on one host (and one SLURM job) that see the same devices would double-book them."""
    seen: dict[tuple[str, str | None], dict[str, str]] = defaultdict(dict)
    for worker in workers:
        owners = seen[(worker.host, worker.job)]
        for device in worker.device_ids():
            if device in owners:
                raise PlacementError(
                    f"workers {owners[device]} and {worker.address} on host {worker.host} both declare GPU "
                    f"{device}: run one GPU worker per node (`--nworkers 1`), or give each worker its own "
                    "CUDA_VISIBLE_DEVICES")
            owners[device] = worker.address


# ---- Leases held on the scheduler, shared by every driver of the cluster ----

LEASES_PLUGIN = "uni-agent-gpu-leases"


class GpuLeases(SchedulerPlugin):
    """Scheduler-side record of the GPU devices each driver's engines hold: {worker: {device: owner}}."""

    name = LEASES_PLUGIN
    idempotent = True  # registering again keeps the existing plugin and its leases

    def __init__(self) -> None:
        self.leases: dict[str, dict[int, str]] = {}

    def busy(self) -> dict[str, list[int]]:
        return {worker: sorted(devices) for worker, devices in self.leases.items() if devices}

    def claim(self, owner: str, claims: Mapping[str, Iterable[int]]) -> dict[str, list[int]]:
        """Take every device in `claims` for `owner`, or none of them; returns the conflicts (empty on success)."""
        conflicts = {worker: sorted(d for d in devices if self.leases.get(worker, {}).get(d, owner) != owner)
                     for worker, devices in claims.items()}
        conflicts = {worker: devices for worker, devices in conflicts.items() if devices}
        if not conflicts:
            for worker, devices in claims.items():
                self.leases.setdefault(worker, {}).update(dict.fromkeys(devices, owner))
        return conflicts

    def release(self, owner: str) -> None:
        for devices in self.leases.values():
            for device in [d for d, o in devices.items() if o == owner]:
                del devices[device]

    def remove_worker(self, scheduler: Any, worker: str, **kwargs: Any) -> None:
        self.leases.pop(worker, None)

    def remove_client(self, scheduler: Any, client: str) -> None:
        self.release(client)


def _leases_call(method: str, *args: Any, dask_scheduler: Any = None) -> Any:
    """Runs on the scheduler (client.run_on_scheduler)."""
    return getattr(dask_scheduler.plugins[LEASES_PLUGIN], method)(*args)


def _gpu_env() -> dict[str, str | None]:
    """Runs on each GPU worker: what it sees of its devices."""
    return {"host": socket.gethostname(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID")}


async def gpu_workers(client: Any, resource: str = "GPU") -> list[GpuWorker]:
    """The workers that declare `resource`, with what each sees of its devices."""
    info = (await client.scheduler.identity(n_workers=-1))["workers"]
    addresses = sorted(a for a, w in info.items() if float((w.get("resources") or {}).get(resource, 0)) >= 1)
    if not addresses:
        return []
    envs = await client.run(_gpu_env, workers=addresses)
    workers = []
    for address in addresses:
        env = envs[address]
        visible = env["cuda_visible_devices"]
        workers.append(GpuWorker(
            address=address, host=env["host"] or info[address]["host"], gpus=int(info[address]["resources"][resource]),
            visible=None if visible is None else tuple(v.strip() for v in visible.split(",") if v.strip()),
            job=env["slurm_job_id"]))
    return workers


async def place_replicas(client: Any, *, tp: int, nnodes: int, n_gpus_per_node: int,
                         resource: str = "GPU") -> list[Replica]:
    """Plan the replicas on devices no other driver holds, and lease them to this client until release_replicas."""
    workers = await gpu_workers(client, resource)
    await client.register_plugin(GpuLeases())  # idempotent: a plugin already there (e.g. from the preload) stays
    for _attempt in range(3):  # another driver may claim between our read and our claim: plan again
        busy = await client.run_on_scheduler(_leases_call, "busy")
        replicas = plan_replicas(workers, tp=tp, nnodes=nnodes, n_gpus_per_node=n_gpus_per_node, busy=busy)
        claims: dict[str, list[int]] = defaultdict(list)
        for replica in replicas:
            claims[replica.worker].extend(replica.devices)
        if not await client.run_on_scheduler(_leases_call, "claim", client.id, dict(claims)):
            return replicas
    raise PlacementError("could not lease GPUs: other drivers keep claiming the same devices")


async def place_group_again(client: Any, lost: tuple[str, str], regrouped: dict[tuple[str, str], Any],
                            *, tp: int, resource: str = "GPU") -> tuple[str, str]:
    """A new GPU group (worker, CUDA_VISIBLE_DEVICES) for the servers of the group `lost` (its worker left): the
    servers that shared it share the new one (`regrouped` holds its placement, which they await together).
    PlacementError while no GPU worker has `tp` free devices (the lost worker's leases went with it)."""
    async def place() -> tuple[str, str]:
        [replica] = await place_replicas(client, tp=tp, nnodes=1, n_gpus_per_node=tp, resource=resource)
        return replica.worker, replica.cuda_visible_devices

    if lost not in regrouped:
        regrouped[lost] = asyncio.ensure_future(place())
    try:
        return await asyncio.shield(regrouped[lost])
    except PlacementError:
        regrouped.pop(lost, None)  # asked again at the next poll
        raise


async def release_replicas(client: Any) -> None:
    await client.run_on_scheduler(_leases_call, "release", client.id)

