"""Turn a model reply into validated tool calls.

Calls arrive either structured (the server parsed them into OpenAI `tool_calls`: structured.py) or as plain text that
the model wrote itself in one of the text formats (when the server does not parse tools: one module per format,
found by name in format_names.py, each behind text_format.TextFormat). Both paths end in one validator (validation.py),
and every ToolCallFormatError is worded for the model: the agent loop sends str(error) back to it as the result of
its turn, so each message says what was wrong and how to write the call instead.
"""

from .calls import ParsedReply, ToolCall, ToolCallFormatError
from .hermes import tool_call_json_schema
from .format_names import TEXT_FORMATS, decoding_schema, format_call, parse_text, text_format, tool_format_instructions
from .structured import parse_structured
from .text_format import TextFormat
from .validation import validate_call

__all__ = [
    "TEXT_FORMATS", "ParsedReply", "TextFormat", "ToolCall", "ToolCallFormatError", "decoding_schema", "format_call",
    "parse_structured",
    "parse_text", "text_format", "tool_call_json_schema", "tool_format_instructions", "validate_call",
]
