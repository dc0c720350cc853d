"""LLM engines. Each speaks the OpenAI-compatible API; a server engine runs as a subprocess owned by a Dask actor
that publishes its URL. `start_engines` returns the URLs the agent workers should use."""

from __future__ import annotations

import importlib

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


# The seam: engine name -> "module:function" with the signature (client, settings, log_dir) -> Engines. A new engine
# (SGLang, say) is one module with one such function, one line here, and its name in RunSettings.engine.
ENGINES = {
    "external": "external:external_engines",
    "llama_cpp": "llama_cpp:start_llama_cpp",
    "vllm": "vllm:start_vllm",
}


async def start_engines(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    if settings.engine not in ENGINES:
        raise ValueError(f"unknown engine {settings.engine!r}; known: {', '.join(sorted(ENGINES))}")
    module, function = ENGINES[settings.engine].split(":")
    start = getattr(importlib.import_module(f".{module}", __name__), function)  # imported only when chosen
    return await start(client, settings, log_dir)
