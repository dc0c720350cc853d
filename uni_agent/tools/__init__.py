"""The tools the model can call, and the one place that runs a parsed call against a sandbox."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from ..config import InteractionConfig
from ..sandbox import Sandbox, clip_output
from ..tool_calls import ToolCall
from .editor import EditorError, StrReplaceEditor

EXECUTE_BASH_SCHEMA = {
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

SUBMIT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "submit",
        "description": "Finish the task. Call it once your changes are complete; the changes are then graded.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    },
}

SCHEMAS = {
    "execute_bash": EXECUTE_BASH_SCHEMA,
    "str_replace_editor": StrReplaceEditor.SCHEMA,
    "submit": SUBMIT_SCHEMA,
}


@dataclass(frozen=True)
class ToolOutcome:
    observation: str
    status: Literal["ok", "error", "timeout"]
    submitted: bool
    duration_s: float


class Toolbox:
    """The tools of one rollout, bound to its sandbox."""

    def __init__(self, names: list[str], sandbox: Sandbox, interaction: InteractionConfig):
        self.names = names
        self.sandbox = sandbox
        self.interaction = interaction
        self.editor = StrReplaceEditor(sandbox, max_view_chars=interaction.max_observation_chars)

    @property
    def schemas(self) -> list[dict]:
        return [SCHEMAS[name] for name in self.names]

    async def run(self, call: ToolCall) -> ToolOutcome:
        started = time.monotonic()
        if call.name not in self.names:  # the parser validates too; this guards direct callers
            return ToolOutcome(f"Unknown tool {call.name!r}; available: {', '.join(self.names)}", "error", False, 0.0)
        if call.name == "submit":
            return ToolOutcome("Submitted. The episode is over.", "ok", True, time.monotonic() - started)
        if call.name == "execute_bash":
            observation, status = await self._bash(call.arguments["command"])
        else:
            try:
                observation, status = await self.editor(call.arguments), "ok"
            except EditorError as exc:
                observation, status = f"Error: {exc}", "error"
        return ToolOutcome(observation, status, False, time.monotonic() - started)

    async def _bash(self, command: str) -> tuple[str, Literal["ok", "error", "timeout"]]:
        timeout = self.interaction.action_timeout
        result = await self.sandbox.exec(command, timeout)
        text = result.output.replace("\r\n", "\n")
        if result.truncated_bytes:
            text += f"\n<{result.truncated_bytes} more bytes of output were discarded>"
        text = clip_output(text, self.interaction.max_observation_chars)
        if result.timed_out:
            note = (f"The command was killed because it ran longer than {timeout:g} seconds. "
                    "Run long jobs with a smaller input, or in the background with output redirected to a file.")
            return (text + "\n" + note).strip(), "timeout"
        if not text.strip():
            text = "(no output)"
        status: Literal["ok", "error"] = "ok" if result.exit_code == 0 else "error"
        return f"{text.rstrip()}\n[exit code: {result.exit_code}]", status
