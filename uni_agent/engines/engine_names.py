"""LLM engines by name (RunSettings.engine and `--engine` are checked against ENGINES: by `check_engine` when a run
starts, before anything is made, and by the CLI's parser).

Each entry is the "module:function" path of an engine's start function, imported only when that engine is chosen
(vLLM's and llama.cpp's modules need what the others do not). The function has the shape of
uni_agent.engines.StartEngines. A new engine (SGLang, say) is one module with one such function and one line here,
or an `ENGINES.register(name, function)` call from outside the package. The order is the order `--help` lists them in.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from ..registry import Registry, UnknownName, is_import_path

if TYPE_CHECKING:
    from ..settings import RunSettings

ENGINES: Registry[Any] = Registry("engine", {
    "llama_cpp": "uni_agent.engines.llama_cpp:start_llama_cpp",
    "external": "uni_agent.engines.external:external_engines",
    "vllm": "uni_agent.engines.vllm:start_vllm",
})


def check_engine(settings: RunSettings) -> None:
    """settings.engine is a registered engine or the import path of a start function that imports (imported now);
    else a ConfigError naming the setting as it was given (`--engine`, UNI_AGENT_ENGINE, a settings file's key), e.g.
    `UNI_AGENT_ENGINE: unknown engine 'llama-cpp' (did you mean llama_cpp?); known engines: llama_cpp, external, vllm
    (or module:function)`. Settings do not check it themselves: they know no engine (the engines read them)."""
    name = settings.engine
    try:
        ENGINES.check(name)
        return
    except UnknownName as exc:
        problem = str(exc)  # an import path that does not import: why not
    if not is_import_path(name):
        close = difflib.get_close_matches(name, ENGINES.names(), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problem = f"unknown engine {name!r}{hint}; known engines: {', '.join(ENGINES.names())} (or module:function)"
    raise ConfigError(f"{settings.origin('engine')}: {problem}")
