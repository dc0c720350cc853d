"""The tools of one rollout, bound to its sandbox: the one place that runs a parsed call."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..sandbox import Sandbox
from ..tool_calls import ToolCall
from .base import Status, Tool, ToolClass, ToolLimits
from .tool_names import TOOLS


def tool_class(name: str) -> ToolClass:
    """The registered tool `name`; an unknown name is an UnknownName (a ValueError) listing the known ones."""
    return TOOLS.get(name)


def tool_schemas(names: list[str]) -> list[dict]:
    """The function schemas of the named tools, in that order (what the model is shown)."""
    return [tool_class(name).SCHEMA for name in names]


@dataclass(frozen=True)
class ToolOutcome:
    observation: str
    status: Status
    submitted: bool
    duration_s: float


class Toolbox:
    def __init__(self, names: list[str], sandbox: Sandbox, interaction: ToolLimits):
        self.names = names
        self.sandbox = sandbox
        self.interaction = interaction
        # keyed by the function name the model calls: a tool named by import path ("pkg.mod:Tool") is called by its
        # schema's name
        self.tools: dict[str, Tool] = {}
        for name in names:
            cls = tool_class(name)
            self.tools[cls.SCHEMA["function"]["name"]] = cls(sandbox, interaction)

    @property
    def schemas(self) -> list[dict]:
        return tool_schemas(self.names)

    async def run(self, call: ToolCall) -> ToolOutcome:
        started = time.monotonic()
        if call.name not in self.tools:  # the parser validates too; this guards direct callers
            return ToolOutcome(f"Unknown tool {call.name!r}; available: {', '.join(self.tools)}", "error", False, 0.0)
        reply = await self.tools[call.name].run(call.arguments)
        return ToolOutcome(reply.observation, reply.status, reply.submitted, time.monotonic() - started)
