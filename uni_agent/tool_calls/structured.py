"""Tool calls the server already parsed: OpenAI message `tool_calls` entries, whose arguments arrive as JSON text
(sometimes encoded twice). Decoded here, then checked by the one validator."""

from __future__ import annotations

import json
from typing import Any

from .calls import ToolCall, ToolCallFormatError
from .schemas import example_arguments, functions
from .validation import raise_collected, validate_call
from .wording import excerpt, json_reason


def decode_arguments(raw: Any, name: Any, tools: list[dict]) -> Any:
    """Arguments as sent (JSON text, possibly encoded more than once, or a dict) -> Python value."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    value = raw
    # Some models JSON-encode the arguments object twice (or more); unwrap a few layers.
    for _ in range(3):
        if not isinstance(value, str):
            break
        try:
            value = json.loads(value, strict=False)  # strict=False: raw newlines in strings mean newlines
        except json.JSONDecodeError as e:
            example = json.dumps(example_arguments(functions(tools).get(name) if isinstance(name, str) else None))
            near = value[max(0, e.pos - 40): e.pos + 40]
            raise ToolCallFormatError(
                f"The arguments of your call to {json.dumps(name)} are not valid JSON ({json_reason(e)}, "
                f"near {excerpt(near)}). They began: {excerpt(value, 80)}. "
                f"Send the arguments as one JSON object, for example {example}; escape newlines in strings "
                'as \\n and double quotes as \\".'
            ) from None
    return value


def parse_structured(tool_calls: list[dict], tools: list[dict]) -> list[ToolCall]:
    """Validate OpenAI message `tool_calls` entries into ToolCalls (keeping the model's ids)."""
    calls: list[ToolCall] = []
    problems: list[tuple[int, str]] = []
    entries = tool_calls or []
    for i, entry in enumerate(entries):
        fn = entry.get("function") or {}
        name = fn.get("name")
        try:
            arguments = decode_arguments(fn.get("arguments"), name, tools)
            calls.append(validate_call(name, arguments, tools, call_id=entry.get("id") or None))
        except ToolCallFormatError as e:
            problems.append((i, str(e)))
    raise_collected(problems, len(entries))
    return calls
