"""The GPU engine: `vllm serve` as a subprocess owned by a Dask actor on a GPU worker, one actor per replica.

Placement (uni_agent.engines.placement) decides each replica's worker and devices; the actor is pinned to that worker
and the server sees exactly those devices through CUDA_VISIBLE_DEVICES. vLLM is an optional extra (`pip install
'uni-agent[vllm]'` on the GPU nodes); `vllm_executable` may name another launcher, e.g. a container.

A server that exits after it was ready is a crash: it is logged with the tail of its log and started again on the
same port (uni_agent.engines.server), so the URL the agents hold stays valid. While a replica is down the agent
workers move its rollouts to the other replicas, or wait for it when it is the only one.

The server asks for the run's API key (uni_agent.engines.new_api_key), which it reads from VLLM_API_KEY: never on its
command line. vLLM checks the key on its /v1 routes only; /metrics, /tokenize, /detokenize and /health answer anyone
who can reach the port (they hold no prompt of the run).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import uuid
from pathlib import Path
from typing import Any

import structlog

from ..current_worker import worker_address
from .placement import place_group_again, place_replicas, release_replicas
from .replace import Placed, Replacement, start_pinned
from ..settings import RunSettings
from .base import Engines, new_api_key
from .server import ServerActor

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
    BUSY_METRIC = "vllm:num_requests_running"
    PREFLIGHT = False  # a second copy of the model does not fit beside the first on the replica's GPUs
    API_KEY_ENV = "VLLM_API_KEY"

    def __init__(self, command_args: dict[str, Any], cuda_visible_devices: str, log_path: str,
                 restart_on_crash: bool = True, max_restarts: int = 3, restart_window: float = 3600.0,
                 api_key: str | None = None):
        super().__init__(f"vLLM server ({command_args['served_name']}, GPUs {cuda_visible_devices})", log_path,
                         env={"CUDA_VISIBLE_DEVICES": cuda_visible_devices}, restart_on_crash=restart_on_crash,
                         max_restarts=max_restarts, restart_window=restart_window, api_key=api_key)
        self.command_args = dict(command_args)
        self.cuda_visible_devices = cuda_visible_devices

    def command(self, host: str, port: int) -> list[str]:
        return vllm_command(host=host, port=port, **self.command_args)

    def swap_model(self, path: str) -> str:
        previous, self.command_args["model"] = self.command_args["model"], path
        return previous

    async def describe(self) -> dict[str, Any]:
        return {**await super().describe(), "worker": worker_address(),
                "cuda_visible_devices": self.cuda_visible_devices}


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
    engines = Engines(urls=[], model_name=name, api_key=new_api_key(), cleanups=[lambda: release_replicas(client)])
    devices = [r.cuda_visible_devices for r in replicas]
    regrouped: dict[tuple[str, str], Any] = {}

    def submit(index: int, worker: str) -> Any:
        log_path = str(Path(log_dir).resolve() / f"engine-{index}.log")
        return client.submit(VllmServer, command_args, devices[index], log_path, settings.engine_restart_on_crash,
                             settings.engine_max_restarts, settings.engine_restart_window, api_key=engines.api_key,
                             actor=True, workers=[worker], allow_other_workers=False,
                             key=f"vllm-server-{index}-{uuid.uuid4().hex[:8]}")

    async def place_again(index: int, live: set[str]) -> Placed:
        """Replica `index` anew on free GPUs (PlacementError, asked again later, while no GPU worker has room)."""
        worker, devices[index] = await place_group_again(client, (engines.workers[index], devices[index]), regrouped,
                                                         tp=settings.tp, resource=settings.gpu_resource_name)
        return await start_pinned(submit(index, worker), worker, settings.engine_start_timeout)

    try:
        for replica in replicas:
            future = submit(replica.index, replica.worker)
            engines.futures.append(future)
            engines.workers.append(replica.worker)
            engines.actors.append(await future)
        # vLLM takes minutes to load a model: start every replica at once.
        engines.urls = list(await asyncio.gather(*(a.start(settings.engine_start_timeout) for a in engines.actors)))
        engines.replacement = Replacement(client, place_again, allowed=settings.engine_restart_on_crash,
                                          max_restarts=settings.engine_max_restarts,
                                          window=settings.engine_restart_window)
    except BaseException:
        await engines.stop()
        raise
    for replica, url in zip(replicas, engines.urls):
        log.info("engine_ready", replica=replica.index, worker=replica.worker, devices=replica.cuda_visible_devices,
                 url=url)
    return engines
