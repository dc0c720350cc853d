"""What a tool-call text format is, and the pieces the formats share.

A text format is how a model writes tool calls in plain text, for servers that do not parse calls themselves: it
describes the tools and how to call them in the system prompt, reads a reply into validated calls (or raises a
ToolCallFormatError that tells the model how to write the call instead), and may give a JSON schema that constrains
decoding to well-formed calls. Formats are found by name in uni_agent.tool_calls.format_names.
"""

from __future__ import annotations

from typing import Any, Protocol

from .calls import ParsedReply, ToolCall, ToolCallFormatError
from .validation import raise_collected, validate_call


class TextFormat(Protocol):
    name: str

    def instructions(self, tools: list[dict]) -> str:
        """System-prompt section listing the tools and how to write a call (uni_agent.tool_calls.prompt helps)."""
        ...

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """One call written as the model should write it."""
        ...

    def parse(self, text: str, tools: list[dict]) -> ParsedReply:
        """The reply's thought and its calls, each checked by validation.validate_call (finish_reply does it)."""
        ...

    def decoding_schema(self, tools: list[dict]) -> dict[str, Any] | None:
        """A JSON schema that only well-formed calls of this format match (for `response_format`), or None."""
        ...


def skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def strip_one_newline(value: str) -> str:
    # Only one newline each side belongs to the tag layout; the rest may be meaningful (code, blank lines).
    if value.startswith("\r\n"):
        value = value[2:]
    elif value.startswith("\n"):
        value = value[1:]
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    return value


def malformed(message: str, skeleton: str) -> ToolCallFormatError:
    """An error about a call the format cannot read, ending in the bare shape of one call."""
    return ToolCallFormatError(f"{message}\nWrite each tool call exactly in this format:\n{skeleton}")


def finish_reply(thought: list[str], raw_calls: list[tuple[Any, Any]], tools: list[dict]) -> ParsedReply:
    """Validate the (name, arguments) pairs a format read; one error names every invalid call of the reply."""
    calls: list[ToolCall] = []
    problems: list[tuple[int, str]] = []
    for i, (name, arguments) in enumerate(raw_calls):
        try:
            calls.append(validate_call(name, arguments, tools))
        except ToolCallFormatError as e:
            problems.append((i, str(e)))
    raise_collected(problems, len(raw_calls))
    return ParsedReply(thought="\n".join(p.strip() for p in thought if p.strip()), calls=calls)
