"""The hermes text format: each call one JSON object inside tags, the format of Hermes and Qwen2.5 chat templates:

    <tool_call>
    {"name": "execute_bash", "arguments": {"command": "ls -la"}}
    </tool_call>

The reader forgives what small models commonly get wrong: raw newlines in JSON strings, one closing brace too many,
an unclosed last <tool_call>, a ```json fence around the object, and calls written without the tags (the whole reply
one call object, or fenced call objects). Its decoding schema is the JSON shape of one call.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .calls import ParsedReply, ToolCallFormatError
from .prompt import tools_section
from .schemas import example_call, functions
from .structured import decode_arguments
from .text_format import finish_reply, malformed
from .wording import describe, excerpt, json_reason

_CALL_OPEN = "<tool_call>"
_CALL_CLOSE = "</tool_call>"
# ```json ... ``` (or an untagged fence) holding one JSON object; used for small models that skip the tags.
_FENCE_RE = re.compile(r"```(?:json|JSON)?[ \t]*\r?\n(\{.*?\})\s*```", re.S)
# Keys a bare JSON object may have to count as a call; anything else is ordinary JSON in the answer.
_BARE_CALL_KEYS = {"name", "arguments", "parameters"}

# The bare shape of one call, appended to errors about malformed calls.
SKELETON = f'{_CALL_OPEN}\n{{"name": "TOOL_NAME", "arguments": {{"PARAMETER_NAME": "value"}}}}\n{_CALL_CLOSE}'

HOW_TO_CALL = [
    "Write each call as one JSON object inside tags, in exactly this form:",
    "",
    SKELETON,
    "",
    '- "arguments" is a JSON object mapping parameter names to values; leave out optional '
    "parameters you do not need.",
    "- It must be valid JSON: escape newlines in strings as \\n and double quotes as \\\".",
]


class HermesFormat:
    name = "hermes"

    def instructions(self, tools: list[dict]) -> str:
        return tools_section(tools, HOW_TO_CALL, self.format_call(*example_call(tools)))

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"{_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{_CALL_CLOSE}"

    def parse(self, text: str, tools: list[dict]) -> ParsedReply:
        return _parse(text, tools)

    def decoding_schema(self, tools: list[dict]) -> dict[str, Any] | None:
        return tool_call_json_schema(tools)


FORMAT = HermesFormat()


def _malformed(message: str) -> ToolCallFormatError:
    return malformed(message, SKELETON)


def _strip_fence(body: str) -> str:
    body = body.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    return body.strip()


def _load_object(body: str, tools: list[dict], note: str = "") -> tuple[Any, Any]:
    """JSON text of one hermes call -> (name, decoded arguments)."""
    body = _strip_fence(body)
    try:
        # strict=False: raw newlines inside strings are what the model meant, not an error worth a retry.
        obj, end = json.JSONDecoder(strict=False).raw_decode(body)
        rest = body[end:].strip()
        # Small models often close one brace too many; that is the only trailing text we forgive.
        if rest.strip("}").strip():
            raise json.JSONDecodeError("Extra data after the JSON object", body, end)
    except json.JSONDecodeError as e:
        near = body[max(0, e.pos - 40): e.pos + 40]
        raise _malformed(
            f"The tool call is not valid JSON ({json_reason(e)}, near {excerpt(near)}).{note} "
            f"Your call began: {excerpt(body, 80)}. Strings must be valid JSON: escape newlines as \\n "
            'and double quotes as \\".',
        ) from None
    if not isinstance(obj, dict):
        raise _malformed(f"A tool call must be a JSON object with \"name\" and \"arguments\", "
                         f"but got {describe(obj)}.")
    if "name" not in obj:
        raise _malformed('The tool call has no "name" key.')
    name = obj["name"]
    raw_args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    return name, decode_arguments(raw_args, name, tools)


def _is_call_object(text: str) -> bool:
    try:
        obj = json.loads(text, strict=False)
    except ValueError:
        return False
    return isinstance(obj, dict) and "name" in obj and set(obj) <= _BARE_CALL_KEYS


def _parse_bare_json(text: str, tools: list[dict]) -> ParsedReply | None:
    """Calls written without tags: the whole reply one JSON object, or ```json fenced objects."""
    stripped = text.strip()
    if stripped.startswith("{") and stripped.endswith("}"):
        if _is_call_object(stripped):
            return finish_reply([], [_load_object(stripped, tools)], tools)
        if '"name"' in stripped and '"arguments"' in stripped:
            _load_object(stripped, tools)  # an attempted call that does not parse: raises the JSON error
        return None
    blocks = [m for m in _FENCE_RE.finditer(text) if _is_call_object(m.group(1))]
    if not blocks:
        return None
    thought, raw_calls, pos = [], [], 0
    for m in blocks:
        thought.append(text[pos:m.start()])
        raw_calls.append(_load_object(m.group(1), tools))
        pos = m.end()
    thought.append(text[pos:])
    return finish_reply(thought, raw_calls, tools)


def _parse(text: str, tools: list[dict]) -> ParsedReply:
    if _CALL_OPEN not in text:
        bare = _parse_bare_json(text, tools)
        return bare if bare is not None else ParsedReply(thought=text.strip(), calls=[])
    thought: list[str] = []
    raw_calls: list[tuple[Any, Any]] = []
    pos = 0
    while (start := text.find(_CALL_OPEN, pos)) >= 0:
        thought.append(text[pos:start])
        body_start = start + len(_CALL_OPEN)
        close = text.find(_CALL_CLOSE, body_start)
        next_open = text.find(_CALL_OPEN, body_start)
        if close >= 0 and not (0 <= next_open < close):
            raw_calls.append(_load_object(text[body_start:close], tools))
            pos = close + len(_CALL_CLOSE)
            continue
        if next_open >= 0:
            raise _malformed(f"A {_CALL_OPEN} block is not closed with {_CALL_CLOSE} before the next call "
                             f"starts; close every call.")
        # Unclosed at the end of the text (e.g. generation stopped at the tag): fine if the JSON is whole.
        note = f" Also close the call with {_CALL_CLOSE}."
        raw_calls.append(_load_object(text[body_start:], tools, note=note))
        pos = len(text)
    thought.append(text[pos:])
    return finish_reply(thought, raw_calls, tools)


def tool_call_json_schema(tools: list[dict]) -> dict[str, Any]:
    """A JSON schema matching exactly one valid call `{"name": ..., "arguments": {...}}` of one of the tools.

    Servers that constrain decoding by a schema (llama.cpp's `response_format`) then can only produce well-formed
    calls, which small models otherwise rarely manage."""
    variants = []
    for name, fn in functions(tools).items():
        params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
        params.setdefault("type", "object")
        variants.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "arguments": params},
            "required": ["name", "arguments"],
        })
    return {"anyOf": variants}
