"""LLM engines by name (RunSettings.engine and `--engine` are checked against ENGINES).

Each entry is the "module:function" path of an engine's start function, imported only when that engine is chosen
(vLLM's and llama.cpp's modules need what the others do not). The function has the shape of
uni_agent.engines.StartEngines. A new engine (SGLang, say) is one module with one such function and one line here,
or an `ENGINES.register(name, function)` call from outside the package. The order is the order `--help` lists them in.
"""

from __future__ import annotations

from typing import Any

from ..registry import Registry

ENGINES: Registry[Any] = Registry("engine", {
    "llama_cpp": "uni_agent.engines.llama_cpp:start_llama_cpp",
    "external": "uni_agent.engines.external:external_engines",
    "vllm": "uni_agent.engines.vllm:start_vllm",
})
