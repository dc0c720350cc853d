"""Tool-call text formats by name (InteractionConfig.tool_call_parser picks one), and the calls that go through the chosen
one. A new format is one module with an object that has TextFormat's methods, and one line in TEXT_FORMATS; from outside
the package, `tool_call_parser: mypkg.formats:FORMAT` names it by import path (imported in the agent workers)."""

from __future__ import annotations

from typing import Any

from ..registry import Registry
from .calls import ParsedReply
from .text_format import TextFormat

TEXT_FORMATS: Registry[TextFormat] = Registry("tool-call text format", {
    "qwen3_coder": "uni_agent.tool_calls.qwen3_coder:FORMAT",
    "hermes": "uni_agent.tool_calls.hermes:FORMAT",
})


def text_format(name: str) -> TextFormat:
    """The format registered as `name`; an unknown name is an UnknownName (a ValueError) listing the known ones."""
    return TEXT_FORMATS.get(name)


def parse_text(text: str, tools: list[dict], fmt: str) -> ParsedReply:
    """Split a plain-text reply into thought and validated calls written in format `fmt`."""
    return text_format(fmt).parse(text, tools)


def format_call(name: str, arguments: dict[str, Any], fmt: str) -> str:
    """Render one call as the model should write it in format `fmt`."""
    return text_format(fmt).format_call(name, arguments)


def tool_format_instructions(tools: list[dict], fmt: str) -> str:
    """System-prompt section listing the tools and how to write a call in `fmt` (for servers that do not render
    tools)."""
    return text_format(fmt).instructions(tools)


def decoding_schema(tools: list[dict], fmt: str) -> dict[str, Any] | None:
    """The JSON schema that only well-formed calls in `fmt` match (for a server's `response_format`), or None when
    the format is not JSON (no schema can constrain it)."""
    return text_format(fmt).decoding_schema(tools)
