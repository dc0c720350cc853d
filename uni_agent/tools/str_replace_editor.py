"""The `str_replace_editor` tool as the toolbox runs it: the editor (uni_agent.tools.editor) bound to the rollout's
sandbox, its errors turned into observations the model can act on."""

from __future__ import annotations

from typing import Any

from ..sandbox import Sandbox
from .base import ToolLimits, ToolReply
from .editor import EditorError, StrReplaceEditor


class StrReplaceEditorTool:
    SCHEMA = StrReplaceEditor.SCHEMA

    def __init__(self, sandbox: Sandbox, interaction: ToolLimits):
        self.editor = StrReplaceEditor(sandbox, max_view_chars=interaction.max_observation_chars)

    async def run(self, arguments: dict[str, Any]) -> ToolReply:
        try:
            return ToolReply(await self.editor(arguments), "ok")
        except EditorError as exc:
            return ToolReply(f"Error: {exc}", "error")
