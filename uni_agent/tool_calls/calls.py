"""What a model reply turns into: tool calls (validated), the thought around them, or an error worded for the model."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ToolCall:
    id: str  # from the model when structured, else generated like "call_<8 hex>"
    name: str
    arguments: dict[str, Any]


class ToolCallFormatError(ValueError):
    """The model's reply holds a malformed or invalid tool call; str(e) is written for the model to read and fix it."""


@dataclass(frozen=True)
class ParsedReply:
    thought: str  # text outside the tool calls (stripped)
    calls: list[ToolCall]


def new_call_id() -> str:
    return f"call_{secrets.token_hex(4)}"
