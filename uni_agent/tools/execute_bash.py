"""The `execute_bash` tool: one bash command in the rollout's sandbox, its output clipped for the model."""

from __future__ import annotations

from typing import Any

from ..sandbox import Sandbox, clip_output
from .base import Status, ToolLimits, ToolReply


class ExecuteBash:
    SCHEMA = {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": (
                "Run a bash command in the task's sandbox and return its output (stdout and stderr) and exit code. "
                "The working directory and exported variables persist between calls. There is no network. "
                "Commands that run longer than the action timeout are killed; avoid interactive programs."
            ),
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The bash command to run."}},
                "required": ["command"],
            },
        },
    }

    def __init__(self, sandbox: Sandbox, interaction: ToolLimits):
        self.sandbox = sandbox
        self.interaction = interaction

    async def run(self, arguments: dict[str, Any]) -> ToolReply:
        command = arguments["command"]
        timeout = self.interaction.action_timeout
        result = await self.sandbox.exec(command, timeout)
        text = result.output.replace("\r\n", "\n")
        if result.truncated_bytes:
            text += f"\n<{result.truncated_bytes} more bytes of output were discarded>"
        text = clip_output(text, self.interaction.max_observation_chars)
        if result.timed_out:
            note = (f"The command was killed because it ran longer than {timeout:g} seconds. "
                    "Run long jobs with a smaller input, or in the background with output redirected to a file.")
            return ToolReply((text + "\n" + note).strip(), "timeout")
        if not text.strip():
            text = "(no output)"
        status: Status = "ok" if result.exit_code == 0 else "error"
        return ToolReply(f"{text.rstrip()}\n[exit code: {result.exit_code}]", status)
