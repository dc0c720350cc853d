"""What every engine gives the run: `Engines` (its URLs, model name, API key and the server actors to stop) and the
shape of an engine's start function (`StartEngines`), apart from the registry of engines by name, so that an engine's
module imports these without importing the registry that names it.

A server engine answers only its run: `new_api_key` makes a secret once per run on the driver, which the server
actors give their server in its environment (never on a command line: /proc/PID/cmdline is readable by every user)
and every client of the run sends as its Bearer token (Engines.api_key)."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..redact import register_secret
from .running import LOST
from .watch import Notify, guard

T = TypeVar("T")

# nothing here loads the model client (uni_agent.llm, through replace.py): the package's __init__ imports this module
if TYPE_CHECKING:
    from ..settings import RunSettings
    from .replace import Replacement


@dataclass
class Engines:
    urls: list[str]  # each replica's first URL: its name for the agents, wherever it serves now (`moves`)
    model_name: str
    api_key: str | None = None
    actors: list[Any] = field(default_factory=list)  # server actors to stop at the end (none for external)
    futures: list[Any] = field(default_factory=list)  # an actor lives only while its future is referenced
    cleanups: list[Callable[[], Awaitable[None]]] = field(default_factory=list)  # after the actors (GPU leases)
    workers: list[str] = field(default_factory=list)  # the worker each actor runs on
    replacement: Replacement | None = None  # places a replica again when its worker leaves (replace.py)
    moves: dict[str, str] = field(default_factory=dict)  # first URL -> URL now, of replicas placed again

    def current_urls(self) -> list[str]:
        """Where each replica serves now."""
        return [self.moves.get(url, url) for url in self.urls]

    async def guard(self, work: Awaitable[T], notify: Notify | None = None) -> T:
        """`work`'s result, or EngineFailed (and `work` cancelled) once every server is down for good (watch.py).
        Meanwhile a replica whose worker left is placed again (replace.py)."""
        return await guard(self, work, notify)

    async def stop(self) -> None:
        """Stops every server (a failure to stop one does not leave the others running), then the cleanups."""
        errors = []
        if self.replacement is not None:
            await self.replacement.close(self)
        for actor, future in zip(self.actors, self.futures or [None] * len(self.actors)):
            if future is not None and future.status in LOST:
                continue  # its worker is gone, and the server with it (PR_SET_PDEATHSIG)
            try:
                await actor.stop()
            except Exception as exc:  # e.g. its worker left just now
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
    """What engine_names.ENGINES holds: start the engine's servers (or check an external endpoint) for this run, on the
    Dask cluster of `client`, server logs under `log_dir`."""

    async def __call__(self, client: Any, settings: RunSettings, log_dir: str) -> Engines: ...
