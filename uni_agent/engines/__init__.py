"""LLM engines. Each speaks the OpenAI-compatible API; a server engine runs as a subprocess owned by a Dask actor
that publishes its URL. `start_engines` returns the URLs the agent workers should use."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..settings import RunSettings


@dataclass
class Engines:
    urls: list[str]
    model_name: str
    api_key: str | None = None
    actors: list[Any] = field(default_factory=list)  # server actors to stop at the end (none for external)
    futures: list[Any] = field(default_factory=list)  # an actor lives only while its future is referenced

    async def stop(self) -> None:
        for actor in self.actors:
            await actor.stop()


async def start_engines(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    if settings.engine == "external":
        from .external import external_engines

        return await external_engines(settings)
    if settings.engine == "llama_cpp":
        from .llama_cpp import start_llama_cpp

        return await start_llama_cpp(client, settings, log_dir)
    raise NotImplementedError(
        "engine 'vllm' is not available yet: start `vllm serve` yourself and use "
        "--engine external --base-url http://HOST:PORT/v1 --model NAME"
    )
