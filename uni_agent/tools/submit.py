"""The `submit` tool: the model says it is done; the episode ends and the workspace's changes are graded."""

from __future__ import annotations

from typing import Any

from ..sandbox import Sandbox
from .base import ToolLimits, ToolReply


class Submit:
    SCHEMA = {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Finish the task. Call it once your changes are complete; the changes are then graded.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    }

    def __init__(self, sandbox: Sandbox, interaction: ToolLimits):
        pass  # nothing to hold: submitting touches nothing

    async def run(self, arguments: dict[str, Any]) -> ToolReply:
        return ToolReply("Submitted. The episode is over.", "ok", submitted=True)
