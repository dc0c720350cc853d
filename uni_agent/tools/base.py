"""What a tool is: a class with the function schema the model sees, made once per rollout with its sandbox, whose
`run` takes the validated arguments of one call and returns what the model reads next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from ..sandbox import Sandbox

Status = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class ToolReply:
    observation: str
    status: Status  # timeout counts against the rollout's timeout budget
    submitted: bool = False  # the episode ends after this call


class ToolLimits(Protocol):
    """What the built-in tools read of the agent's interaction config (uni_agent.config.InteractionConfig, which a
    tool is given whole)."""

    @property
    def action_timeout(self) -> float: ...

    @property
    def max_observation_chars(self) -> int: ...


class Tool(Protocol):
    async def run(self, arguments: dict[str, Any]) -> ToolReply: ...


class ToolClass(Protocol):
    """What uni_agent.tools.tool_names holds."""

    SCHEMA: ClassVar[dict]  # OpenAI function form: {"type": "function", "function": {"name", "description", ...}}

    def __call__(self, sandbox: Sandbox, interaction: ToolLimits) -> Tool: ...
