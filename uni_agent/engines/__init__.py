"""LLM engines. Each speaks the OpenAI-compatible API; a server engine runs as a subprocess owned by a Dask actor
that publishes its URL. `start_engines` starts the chosen engine (found by name in registry.py) and returns the URLs
the agent workers should use.

A server engine answers only its run: `new_api_key` makes a secret once per run on the driver, which the server
actors give their server in its environment (never on a command line: /proc/PID/cmdline is readable by every user)
and every client of the run sends as its Bearer token (Engines.api_key)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..redact import register_secret
from .registry import ENGINES
from .watch import EngineFailed, Notify, guard

__all__ = ["ENGINES", "EngineFailed", "Engines", "StartEngines", "new_api_key", "start_engines"]
T = TypeVar("T")

if TYPE_CHECKING:  # settings imports registry.py, which runs this __init__ first: no run-time import back
    from ..settings import RunSettings


@dataclass
class Engines:
    urls: list[str]
    model_name: str
    api_key: str | None = None
    actors: list[Any] = field(default_factory=list)  # server actors to stop at the end (none for external)
    futures: list[Any] = field(default_factory=list)  # an actor lives only while its future is referenced
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # after the actors (GPU leases)

    async def guard(self, work: Awaitable[T], notify: Notify | None = None) -> T:
        """`work`'s result, or EngineFailed (and `work` cancelled) once every server is down for good (watch.py)."""
        return await guard(self.actors, work, notify)

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


def new_api_key() -> str:
    """A fresh secret for the engines this run starts, registered so that no log or error message shows it."""
    key = secrets.token_urlsafe(32)
    register_secret(key)
    return key


class StartEngines(Protocol):
    """What registry.ENGINES holds: start the engine's servers (or check an external endpoint) for this run, on the
    Dask cluster of `client`, server logs under `log_dir`."""

    async def __call__(self, client: Any, settings: RunSettings, log_dir: str) -> Engines: ...


async def start_engines(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    """An unknown engine name is an UnknownName (a ValueError) listing the known ones."""
    start: StartEngines = ENGINES.get(settings.engine)
    return await start(client, settings, log_dir)
