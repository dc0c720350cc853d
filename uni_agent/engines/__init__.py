"""LLM engines. Each speaks the OpenAI-compatible API; a server engine runs as a subprocess owned by a Dask actor
that publishes its URL. `start_engines` starts the chosen engine (found by name in engine_names.py) and returns the URLs
the agent workers should use (an `Engines`, base.py). A replica whose worker leaves is placed again elsewhere
(replace.py); its first URL stays its name for the agents (uni_agent.llm.relocation).

The engine's name is checked against the registry before a run's cluster starts (`check_engine`): settings know no
engine, so that the engines may read the settings.

The engines' modules import base.py, never this package's names: the registry names them by path, and this module
imports the registry."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .base import Engines, StartEngines, new_api_key
from .engine_names import ENGINES, check_engine
from .watch import EngineFailed

__all__ = ["ENGINES", "EngineFailed", "Engines", "StartEngines", "check_engine", "new_api_key", "start_engines"]

if TYPE_CHECKING:
    from ..settings import RunSettings


async def start_engines(client: Any, settings: RunSettings, log_dir: str) -> Engines:
    """An unknown engine name is an UnknownName (a ValueError) listing the known ones."""
    start: StartEngines = ENGINES.get(settings.engine)
    return await start(client, settings, log_dir)
