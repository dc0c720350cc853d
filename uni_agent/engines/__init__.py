"""LLM engines. Each speaks the OpenAI-compatible API; a server engine runs as a subprocess owned by a Dask actor
that publishes its URL. `start_engines` returns the URLs the agent workers should use."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # after the actors (GPU leases)

    async def stop(self) -> None:
        """Stops every server (a failure to stop one does not leave the others running), then the cleanups."""
        errors = []
        for actor in self.actors:
            try:
                await actor.stop()
            except Exception as exc:  # e.g. its worker is gone, and the server with it (PR_SET_PDEATHSIG)
                errors.append(exc)
        for cleanup in self.cleanups:
            await cleanup()
        if errors:
            raise errors[0]


async def start_engines(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    if settings.engine == "external":
        from .external import external_engines

        return await external_engines(settings)
    if settings.engine == "llama_cpp":
        from .llama_cpp import start_llama_cpp

        return await start_llama_cpp(client, settings, log_dir)
    if settings.engine == "vllm":
        from .vllm import start_vllm

        return await start_vllm(client, settings, log_dir)
    raise ValueError(f"unknown engine {settings.engine!r}")
