"""The GPU engine: `vllm serve` as a subprocess owned by a Dask actor on a GPU worker, one actor per replica.

Placement (uni_agent.engines.placement) decides each replica's worker and devices; the actor is pinned to that worker
and the server sees exactly those devices through CUDA_VISIBLE_DEVICES. vLLM is an optional extra (`pip install
'uni-agent[vllm]'` on the GPU nodes); `vllm_executable` may name another launcher, e.g. a container.

A server that exits after it was ready is a crash: it is logged with the tail of its log and, when
`engine_restart_on_crash` is on, started again on the same port (so the URL the agents hold stays valid) up to
`engine_max_restarts` times. While a replica is down the agent workers move its rollouts to the other replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import uuid
from pathlib import Path
from typing import Any

import structlog

from ..current_worker import worker_address
from .placement import place_replicas, release_replicas
from ..settings import RunSettings
from . import Engines
from .server import ServerActor, _die_with_parent, free_port, worker_host

log = structlog.get_logger("uni_agent.engines.vllm")


def vllm_command(executable: str, model: str, served_name: str, *, tp: int, gpu_memory_utilization: float,
                 max_model_len: int, tool_call_parser: str, host: str, port: int,
                 sampling: dict[str, Any] | None = None, extra_args: list[str] | None = None) -> list[str]:
    """The `vllm serve` command line (pure: checked by unit tests)."""
    command = [
        *shlex.split(executable), "serve", model,
        "--served-model-name", served_name,
        "--tensor-parallel-size", str(tp),
        "--gpu-memory-utilization", str(gpu_memory_utilization),
        "--max-model-len", str(max_model_len),
        "--enable-auto-tool-choice", "--tool-call-parser", tool_call_parser,
        "--host", host, "--port", str(port),
    ]
    if sampling:  # server-side defaults; every request also sends its own temperature/top_p/max_tokens
        command += ["--override-generation-config", json.dumps(sampling, sort_keys=True)]
    return command + list(extra_args or [])


class VllmServer(ServerActor):
    def __init__(self, command_args: dict[str, Any], cuda_visible_devices: str, log_path: str,
                 restart_on_crash: bool = False, max_restarts: int = 3):
        super().__init__(f"vLLM server ({command_args['served_name']}, GPUs {cuda_visible_devices})", log_path,
                         env={"CUDA_VISIBLE_DEVICES": cuda_visible_devices})
        self.command_args = command_args
        self.cuda_visible_devices = cuda_visible_devices
        self.restart_on_crash, self.max_restarts = restart_on_crash, max_restarts
        self.restarts = 0
        self.crashes: list[dict[str, Any]] = []
        self._port: int | None = None
        self._timeout = 0.0
        self._watch: asyncio.Task | None = None
        self._stopping = False

    def command(self, host: str, port: int) -> list[str]:
        return vllm_command(host=host, port=port, **self.command_args)

    async def start(self, timeout: float) -> str:
        """ServerActor.start, except that a restart keeps the first start's port, so the URL stays the same."""
        self._timeout, self._stopping = timeout, False
        host = worker_host()
        if self._port is None:
            self._port = free_port(host)
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log_file:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command(host, self._port), stdout=log_file, stderr=log_file, preexec_fn=_die_with_parent,
                env={**os.environ, **self.env}, start_new_session=True)
        self.url = f"http://{host}:{self._port}/v1"
        await self._wait_ready(timeout)
        self._watch = asyncio.create_task(self._watch_for_crash())
        return self.url

    async def _watch_for_crash(self) -> None:
        proc = self._proc
        if proc is None:
            return
        code = await proc.wait()
        if self._stopping or proc is not self._proc:
            return
        crash = {"returncode": code, "url": self.url, "log_tail": self.log_tail(2000)}
        self.crashes.append(crash)
        log.error("engine_crashed", engine=self.name, url=self.url, returncode=code, log=self.log_path,
                  restart=self.restart_on_crash and self.restarts < self.max_restarts)
        _dask_event({"event": "engine_crashed", "engine": self.name, "url": self.url, "returncode": code})
        if not self.restart_on_crash or self.restarts >= self.max_restarts:
            return
        self.restarts += 1
        with open(self.log_path, "a") as f:
            f.write(f"\n[uni-agent] exit code {code}: restart {self.restarts} of {self.max_restarts}\n")
        try:
            await self.start(self._timeout)
        except Exception as exc:  # noqa: BLE001 - recorded, and the replica stays down
            log.error("engine_restart_failed", engine=self.name, error=f"{type(exc).__name__}: {exc}")
            self.crashes.append({"restart_failed": f"{type(exc).__name__}: {exc}"})

    async def describe(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "worker": worker_address(),
                "cuda_visible_devices": self.cuda_visible_devices, "alive": await self.alive(),
                "pid": self._proc.pid if self._proc is not None else None,
                "restarts": self.restarts, "crashes": self.crashes}

    async def stop(self) -> None:
        self._stopping = True
        watch, self._watch = self._watch, None
        if watch is not None and watch is not asyncio.current_task():  # first, so no restart begins (a cancelled
            # launch kills its own child); a restart that times out calls stop() from inside the watch itself
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        await super().stop()


def _dask_event(msg: dict[str, Any]) -> None:
    with contextlib.suppress(Exception):
        from distributed import get_worker

        get_worker().log_event("uni-agent-engine", msg)


async def start_vllm(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    if not settings.model_path:
        raise ValueError("--engine vllm needs --model-path (a Hugging Face model id or a directory on the GPU nodes)")
    name = settings.model_name or Path(settings.model_path.rstrip("/")).name
    replicas = await place_replicas(client, tp=settings.tp, nnodes=settings.nnodes,
                                    n_gpus_per_node=settings.n_gpus_per_node, resource=settings.gpu_resource_name)
    command_args = {
        "executable": settings.vllm_executable, "model": settings.model_path, "served_name": name, "tp": settings.tp,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "max_model_len": settings.max_model_len or settings.context_length,
        "tool_call_parser": settings.tool_call_parser,
        "sampling": {"temperature": settings.temperature, "top_p": settings.top_p},
        "extra_args": settings.vllm_extra_args,
    }
    engines = Engines(urls=[], model_name=name, cleanups=[lambda: release_replicas(client)])
    try:
        for replica in replicas:
            log_path = str(Path(log_dir).resolve() / f"engine-{replica.index}.log")
            future = client.submit(VllmServer, command_args, replica.cuda_visible_devices, log_path,
                                   settings.engine_restart_on_crash, settings.engine_max_restarts, actor=True,
                                   workers=[replica.worker], allow_other_workers=False,
                                   key=f"vllm-server-{replica.index}-{uuid.uuid4().hex[:8]}")
            engines.futures.append(future)
            engines.actors.append(await future)
        # vLLM takes minutes to load a model: start every replica at once.
        engines.urls = list(await asyncio.gather(*(a.start(settings.engine_start_timeout) for a in engines.actors)))
    except BaseException:
        await engines.stop()
        raise
    for replica, url in zip(replicas, engines.urls):
        log.info("engine_ready", replica=replica.index, worker=replica.worker, devices=replica.cuda_visible_devices,
                 url=url)
    return engines
