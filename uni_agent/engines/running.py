"""What the engine watch (watch.py) and the re-placement (replace.py) see of a run's engines: the fields of
uni_agent.engines.Engines they read and change, as a Protocol, so that neither imports the package that imports them."""

from __future__ import annotations

from typing import Any, Protocol

LOST = ("error", "lost", "cancelled")  # an actor future's status once its worker is gone


class RunningEngines(Protocol):
    urls: list[str]  # each replica's first URL: its name for the agents
    model_name: str
    api_key: str | None
    actors: list[Any]
    futures: list[Any]
    workers: list[str]
    replacement: Any  # replace.Replacement, or None
    moves: dict[str, str]  # first URL -> URL now
