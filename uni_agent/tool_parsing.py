"""Turn a model reply into validated tool calls.

Calls arrive either structured (the server parsed them into OpenAI `tool_calls`) or as plain text that the
model wrote itself in one of TEXT_FORMATS (when the server does not parse tools). Both paths end in one
validator, and every ToolCallFormatError is worded for the model: the agent loop sends str(error) back to
it as the result of its turn, so each message says what was wrong and how to write the call instead.
"""

from __future__ import annotations

import ast
import json
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any

TEXT_FORMATS = ("qwen3_coder", "hermes")


@dataclass(frozen=True)
class ToolCall:
    id: str  # from the model when structured, else generated like "call_<8 hex>"
    name: str
    arguments: dict[str, Any]


class ToolCallFormatError(ValueError):
    """The model's reply holds a malformed or invalid tool call. str(e) is written for the model to read and fix its call."""


@dataclass(frozen=True)
class ParsedReply:
    thought: str  # text outside the tool calls (stripped)
    calls: list[ToolCall]


# Tags of both text formats; hermes shares <tool_call> with qwen3_coder.
_CALL_OPEN = "<tool_call>"
_CALL_CLOSE = "</tool_call>"
_FN_OPEN = "<function="
_FN_CLOSE = "</function>"
_PARAM_OPEN = "<parameter="
_PARAM_CLOSE = "</parameter>"

# Tags that may follow a closed qwen3_coder parameter value.
_QWEN_TAGS = (_PARAM_OPEN, _FN_CLOSE, _CALL_CLOSE, _CALL_OPEN, _FN_OPEN)

_INT_RE = re.compile(r"[+-]?\d+")
# ```json ... ``` (or an untagged fence) holding one JSON object; used for small models that skip the tags.
_FENCE_RE = re.compile(r"```(?:json|JSON)?[ \t]*\r?\n(\{.*?\})\s*```", re.S)
# Keys a bare JSON object may have to count as a call; anything else is ordinary JSON in the answer.
_BARE_CALL_KEYS = {"name", "arguments", "parameters"}


def _new_call_id() -> str:
    return f"call_{secrets.token_hex(4)}"


def _check_fmt(fmt: str) -> None:
    if fmt not in TEXT_FORMATS:
        raise ValueError(f"unknown tool-call text format {fmt!r}; expected one of {TEXT_FORMATS}")


# ---------------------------------------------------------------------------------------------------------
# Schemas


def _functions(tools: list[dict]) -> dict[str, dict]:
    """Map tool name -> function schema."""
    out: dict[str, dict] = {}
    for tool in tools:
        fn = tool.get("function", tool)  # also accept the unwrapped {"name", "parameters"} form
        out[fn["name"]] = fn
    return out


def _properties(fn: dict) -> tuple[dict[str, dict], list[str], bool]:
    """(properties, required names, whether undeclared parameters are allowed)."""
    schema = fn.get("parameters") or {}
    props = schema.get("properties") or {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    # JSON Schema allows extra keys by default, but for tool calls an unknown key is nearly always a typo,
    # so only an explicit additionalProperties lets them through.
    extra_ok = bool(schema.get("additionalProperties", False))
    return props, required, extra_ok


def _types(schema: dict) -> list[str]:
    t = schema.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else [x for x in t if isinstance(x, str)]


def _type_label(schema: dict) -> str:
    labels = []
    for t in _types(schema):
        items = schema.get("items")
        if t == "array" and isinstance(items, dict) and _types(items):
            labels.append(f"array of {_type_label(items)}")
        else:
            labels.append(t)
    return " or ".join(labels) if labels else "any"


def _param_line(name: str, schema: dict, required: bool) -> str:
    facts = [_type_label(schema), "required" if required else "optional"]
    if "enum" in schema:
        facts.append("one of: " + ", ".join(json.dumps(v) for v in schema["enum"]))
    line = f"- {name} ({'; '.join(facts)})"
    desc = (schema.get("description") or "").strip()
    if desc:
        # Indent continuation lines so a multi-line description stays under its parameter.
        line += ": " + desc.replace("\n", "\n  ")
    return line


def _params_block(fn: dict) -> str:
    props, required, _ = _properties(fn)
    if not props:
        return "Parameters: none (call it with no parameters)."
    lines = ["Parameters:"]
    lines += [_param_line(name, schema, name in required) for name, schema in props.items()]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Coercion and validation


class _CoerceError(Exception):
    """Internal: a value does not fit its schema; the message says what was expected."""


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {_excerpt(value, 60)}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _excerpt(text: str, limit: int = 120) -> str:
    # json.dumps keeps the excerpt on one line and shows escapes the model can recognise.
    return json.dumps(text if len(text) <= limit else text[:limit] + "...")


def _json_reason(e: json.JSONDecodeError) -> str:
    # Some json messages already end in " at" ("Invalid control character at").
    return f"{e.msg.removesuffix(' at')} at character {e.pos}"


def _matches(value: Any, t: str) -> bool:
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, list)
    if t == "object":
        return isinstance(value, dict)
    if t == "null":
        return value is None
    return True  # a type we do not know: let the tool judge


def _parse_literal(text: str) -> Any:
    try:
        return json.loads(text, strict=False)
    except ValueError:
        # Models often write Python lists such as [1, 10] or ['a', 'b']; literal_eval reads them safely.
        return ast.literal_eval(text)


def _convert(value: Any, t: str) -> Any:
    """Convert value to JSON type t, or raise (any exception means "cannot")."""
    if t == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            s = value.strip()
            if _INT_RE.fullmatch(s):
                return int(s)
            f = float(s)
            if math.isfinite(f) and f.is_integer():
                return int(f)
    elif t == "number":
        if isinstance(value, str):
            s = value.strip()
            if _INT_RE.fullmatch(s):
                return int(s)
            f = float(s)
            if math.isfinite(f):
                return f
    elif t == "boolean":
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
    elif t in ("array", "object"):
        if isinstance(value, str):
            parsed = _parse_literal(value.strip())
            if t == "array" and isinstance(parsed, tuple):
                parsed = list(parsed)
            if _matches(parsed, t):
                return parsed
    elif t == "string":
        # A bare number in JSON arguments is plainly meant as its text.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    raise ValueError(f"cannot convert to {t}")


def _coerce(value: Any, schema: dict, where: str) -> Any:
    """Return value converted to fit schema (type, items, enum), or raise _CoerceError."""
    types = _types(schema)
    if value is None:
        return None  # null means "not set"; the caller rejects it for required parameters
    if isinstance(value, str) and value.strip() == "null" and types and "string" not in types:
        return None
    result = value
    if types:
        # An exact match wins, so a union such as ["integer", "string"] keeps what the model sent.
        exact = next((t for t in types if _matches(value, t)), None)
        if exact is not None:
            chosen = exact
        else:
            chosen = None
            for t in sorted(types, key=lambda t: t == "string"):  # string last: it would take almost anything
                try:
                    result = _convert(value, t)
                except Exception:  # literal_eval alone can raise several kinds; all mean "not this type"
                    continue
                chosen = t
                break
            if chosen is None:
                raise _CoerceError(f"{where} must be {_type_label(schema)}, but got {_describe(value)}.")
        items = schema.get("items")
        if chosen == "array" and isinstance(items, dict):
            result = [_coerce(v, items, f"{where} item {i}") for i, v in enumerate(result)]
        props = schema.get("properties")
        if chosen == "object" and isinstance(props, dict):
            result = {k: _coerce(v, props[k], f"{where} field {json.dumps(k)}") if k in props else v
                      for k, v in result.items()}
    if "enum" in schema and result not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        raise _CoerceError(f"{where} is {_describe(result)}, which is not allowed; use one of: {allowed}.")
    return result


def validate_call(name: Any, arguments: Any, tools: list[dict], call_id: str | None = None) -> ToolCall:
    """Check a call against the tool schemas and coerce its arguments; the one validator of all paths.

    Raises ToolCallFormatError naming every problem of the call and how to fix it.
    """
    functions = _functions(tools)
    available = ", ".join(functions) or "(none)"
    if not isinstance(name, str) or not name.strip():
        raise ToolCallFormatError(
            f"The tool call has no tool name. Name one of the available tools: {available}."
        )
    fn = functions.get(name.strip())
    if fn is None:
        raise ToolCallFormatError(
            f"Unknown tool {json.dumps(name)}. Available tools: {available}. "
            "Call one of these, spelled exactly as listed."
        )
    name = fn["name"]
    if not isinstance(arguments, dict):
        raise ToolCallFormatError(
            f"The arguments of tool {json.dumps(name)} must be an object that maps parameter names to values, "
            f"but got {_describe(arguments)}.\n{_params_block(fn)}"
        )
    props, required, extra_ok = _properties(fn)
    problems: list[str] = []
    coerced: dict[str, Any] = {}
    for key, value in arguments.items():
        schema = props.get(key)
        if schema is None:
            if extra_ok:
                coerced[key] = value
                continue
            allowed = ", ".join(props) if props else "none; call it with no parameters"
            problems.append(f"Unknown parameter {json.dumps(key)}. Allowed parameters: {allowed}.")
            continue
        try:
            coerced[key] = _coerce(value, schema, f"Parameter {json.dumps(key)}")
        except _CoerceError as e:
            problems.append(str(e))
    for key in required:
        if key not in arguments:
            problems.append(f"Missing required parameter {json.dumps(key)}; add it.")
        elif key in coerced and coerced[key] is None:
            problems.append(f"Required parameter {json.dumps(key)} is null; give it a value.")
    if problems:
        raise ToolCallFormatError(
            f"Invalid call to tool {json.dumps(name)}:\n"
            + "\n".join(f"- {p}" for p in problems)
            + f"\nFix these and call the tool again.\n{_params_block(fn)}"
        )
    return ToolCall(id=call_id or _new_call_id(), name=name, arguments=coerced)


def _raise_collected(problems: list[tuple[int, str]], total: int) -> None:
    """Raise one error for all invalid calls of a reply (so the model fixes them in one go)."""
    if not problems:
        return
    if total == 1:
        raise ToolCallFormatError(problems[0][1])
    body = "\n\n".join(f"Tool call #{i + 1}: {msg}" for i, msg in problems)
    raise ToolCallFormatError(
        f"{len(problems)} of the {total} tool calls in your reply are invalid, so none of them was run. "
        f"Fix them and send all calls again.\n\n{body}"
    )


# ---------------------------------------------------------------------------------------------------------
# Structured calls


def _example_arguments(fn: dict | None) -> dict[str, Any]:
    if fn is None:
        return {"PARAMETER_NAME": "value"}
    props, required, _ = _properties(fn)
    return {k: _example_value(k, props.get(k, {})) for k in required}


def _decode_arguments(raw: Any, name: Any, tools: list[dict]) -> Any:
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
            example = json.dumps(_example_arguments(_functions(tools).get(name) if isinstance(name, str) else None))
            near = value[max(0, e.pos - 40): e.pos + 40]
            raise ToolCallFormatError(
                f"The arguments of your call to {json.dumps(name)} are not valid JSON ({_json_reason(e)}, "
                f"near {_excerpt(near)}). They began: {_excerpt(value, 80)}. "
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
            arguments = _decode_arguments(fn.get("arguments"), name, tools)
            calls.append(validate_call(name, arguments, tools, call_id=entry.get("id") or None))
        except ToolCallFormatError as e:
            problems.append((i, str(e)))
    _raise_collected(problems, len(entries))
    return calls


# ---------------------------------------------------------------------------------------------------------
# Text formats


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _strip_one_newline(value: str) -> str:
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


def _join_thought(parts: list[str]) -> str:
    return "\n".join(p.strip() for p in parts if p.strip())


def _skeleton(fmt: str) -> str:
    """The bare shape of one call, appended to errors about malformed calls."""
    if fmt == "qwen3_coder":
        return (
            f"{_CALL_OPEN}\n{_FN_OPEN}TOOL_NAME>\n{_PARAM_OPEN}PARAMETER_NAME>\nvalue\n{_PARAM_CLOSE}\n"
            f"{_FN_CLOSE}\n{_CALL_CLOSE}"
        )
    return f'{_CALL_OPEN}\n{{"name": "TOOL_NAME", "arguments": {{"PARAMETER_NAME": "value"}}}}\n{_CALL_CLOSE}'


def _malformed(message: str, fmt: str) -> ToolCallFormatError:
    return ToolCallFormatError(f"{message}\nWrite each tool call exactly in this format:\n{_skeleton(fmt)}")


def _read_tag_name(text: str, pos: int, tag: str) -> tuple[str, int]:
    """Read NAME of `<tag=NAME>` starting just after "<tag="; return (NAME, position after ">")."""
    gt = text.find(">", pos)
    newline = text.find("\n", pos)
    if gt < 0 or 0 <= newline < gt:
        raise _malformed(
            f"The tag {_excerpt('<' + tag + '=' + text[pos:pos + 40])} is not closed with \">\" on the same line.",
            "qwen3_coder",
        )
    name = text[pos:gt].strip()
    if not name:
        raise _malformed(f"A <{tag}=...> tag has no name; write <{tag}=NAME>.", "qwen3_coder")
    return name, gt + 1


def _read_qwen_value(text: str, start: int) -> tuple[str, int]:
    """Read a parameter value starting after `<parameter=KEY>`; return (raw value, position after it)."""
    first_close = -1
    search = start
    # Preferred end: a </parameter> followed by the next tag or the end of text, so a value whose code
    # itself contains "</parameter>" is not cut short.
    while (idx := text.find(_PARAM_CLOSE, search)) >= 0:
        if first_close < 0:
            first_close = idx
        after = _skip_ws(text, idx + len(_PARAM_CLOSE))
        if after >= len(text) or text.startswith(_QWEN_TAGS, after):
            return text[start:idx], idx + len(_PARAM_CLOSE)
        search = idx + 1
    if first_close >= 0:
        return text[start:first_close], first_close + len(_PARAM_CLOSE)
    # No </parameter> at all: the model left it out; the value ends at the next tag or the end of text.
    ends = [i + 1 for i in [text.find("\n" + _PARAM_OPEN, start)] if i >= 0]  # keep "\n" for symmetric strip
    ends += [i for i in (text.find(_FN_CLOSE, start), text.find(_CALL_CLOSE, start)) if i >= 0]
    end = min(ends, default=len(text))
    return text[start:end], end


def _parse_qwen3_coder(text: str, tools: list[dict]) -> ParsedReply:
    thought: list[str] = []
    raw_calls: list[tuple[str, dict[str, str]]] = []
    pos = 0
    while True:
        # A call starts at <tool_call>, or at a bare <function=...> when the model dropped the wrapper.
        starts = [i for i in (text.find(_CALL_OPEN, pos), text.find(_FN_OPEN, pos)) if i >= 0]
        if not starts:
            thought.append(text[pos:])
            break
        start = min(starts)
        thought.append(text[pos:start])
        cur = start
        if text.startswith(_CALL_OPEN, cur):
            cur = _skip_ws(text, cur + len(_CALL_OPEN))
            if not text.startswith(_FN_OPEN, cur):
                found = _excerpt(text[cur:cur + 60]) if cur < len(text) else "the end of your reply"
                raise _malformed(f"Expected <function=TOOL_NAME> right after {_CALL_OPEN}, but found {found}.",
                                 "qwen3_coder")
        name, cur = _read_tag_name(text, cur + len(_FN_OPEN), "function")
        arguments: dict[str, str] = {}
        while True:
            cur = _skip_ws(text, cur)
            if cur >= len(text) or text.startswith((_CALL_CLOSE, _CALL_OPEN, _FN_OPEN), cur):
                break  # a missing </function> is tolerated, also when the next call follows directly
            if text.startswith(_FN_CLOSE, cur):
                cur += len(_FN_CLOSE)
                break
            if not text.startswith(_PARAM_OPEN, cur):
                raise _malformed(
                    f"Inside <function={name}> expected <parameter=NAME> or {_FN_CLOSE}, "
                    f"but found {_excerpt(text[cur:cur + 60])}.",
                    "qwen3_coder",
                )
            key, cur = _read_tag_name(text, cur + len(_PARAM_OPEN), "parameter")
            raw, cur = _read_qwen_value(text, cur)
            if key in arguments:
                raise _malformed(f"Parameter {json.dumps(key)} of tool {json.dumps(name)} is given twice; "
                                 "give each parameter once.", "qwen3_coder")
            arguments[key] = _strip_one_newline(raw)
        after = _skip_ws(text, cur)
        if text.startswith(_CALL_CLOSE, after):
            cur = after + len(_CALL_CLOSE)
        # A missing </tool_call> is tolerated: whatever follows is ordinary text.
        raw_calls.append((name, arguments))
        pos = cur
    return _finish(thought, raw_calls, tools)


def _finish(thought: list[str], raw_calls: list[tuple[Any, Any]], tools: list[dict]) -> ParsedReply:
    calls: list[ToolCall] = []
    problems: list[tuple[int, str]] = []
    for i, (name, arguments) in enumerate(raw_calls):
        try:
            calls.append(validate_call(name, arguments, tools))
        except ToolCallFormatError as e:
            problems.append((i, str(e)))
    _raise_collected(problems, len(raw_calls))
    return ParsedReply(thought=_join_thought(thought), calls=calls)


def _strip_fence(body: str) -> str:
    body = body.strip()
    if body.startswith("```"):
        body = body.split("\n", 1)[1] if "\n" in body else ""
        if body.rstrip().endswith("```"):
            body = body.rstrip()[:-3]
    return body.strip()


def _load_hermes_object(body: str, tools: list[dict], note: str = "") -> tuple[Any, Any]:
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
            f"The tool call is not valid JSON ({_json_reason(e)}, near {_excerpt(near)}).{note} "
            f"Your call began: {_excerpt(body, 80)}. Strings must be valid JSON: escape newlines as \\n "
            'and double quotes as \\".',
            "hermes",
        ) from None
    if not isinstance(obj, dict):
        raise _malformed(f"A tool call must be a JSON object with \"name\" and \"arguments\", "
                         f"but got {_describe(obj)}.", "hermes")
    if "name" not in obj:
        raise _malformed('The tool call has no "name" key.', "hermes")
    name = obj["name"]
    raw_args = obj["arguments"] if "arguments" in obj else obj.get("parameters")
    return name, _decode_arguments(raw_args, name, tools)


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
            return _finish([], [_load_hermes_object(stripped, tools)], tools)
        if '"name"' in stripped and '"arguments"' in stripped:
            _load_hermes_object(stripped, tools)  # an attempted call that does not parse: raises the JSON error
        return None
    blocks = [m for m in _FENCE_RE.finditer(text) if _is_call_object(m.group(1))]
    if not blocks:
        return None
    thought, raw_calls, pos = [], [], 0
    for m in blocks:
        thought.append(text[pos:m.start()])
        raw_calls.append(_load_hermes_object(m.group(1), tools))
        pos = m.end()
    thought.append(text[pos:])
    return _finish(thought, raw_calls, tools)


def _parse_hermes(text: str, tools: list[dict]) -> ParsedReply:
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
            raw_calls.append(_load_hermes_object(text[body_start:close], tools))
            pos = close + len(_CALL_CLOSE)
            continue
        if next_open >= 0:
            raise _malformed(f"A {_CALL_OPEN} block is not closed with {_CALL_CLOSE} before the next call "
                             f"starts; close every call.", "hermes")
        # Unclosed at the end of the text (e.g. generation stopped at the tag): fine if the JSON is whole.
        note = f" Also close the call with {_CALL_CLOSE}."
        raw_calls.append(_load_hermes_object(text[body_start:], tools, note=note))
        pos = len(text)
    thought.append(text[pos:])
    return _finish(thought, raw_calls, tools)


def parse_text(text: str, tools: list[dict], fmt: str) -> ParsedReply:
    """Split a plain-text reply into thought and validated calls written in format fmt (one of TEXT_FORMATS)."""
    _check_fmt(fmt)
    if fmt == "qwen3_coder":
        return _parse_qwen3_coder(text, tools)
    return _parse_hermes(text, tools)


# ---------------------------------------------------------------------------------------------------------
# Prompt section


# Placeholder values for common parameter names, so the example call looks like a real one.
_EXAMPLE_STRINGS = {"command": "ls -la", "path": "/path/to/file.py", "query": "search terms"}


def _example_value(name: str, schema: dict) -> Any:
    if schema.get("examples"):
        return schema["examples"][0]
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    t = (_types(schema) or ["string"])[0]
    if t == "integer":
        return 1
    if t == "number":
        return 1.5
    if t == "boolean":
        return True
    if t == "array":
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [_example_value(name, items)] if items else []
    if t == "object":
        return {}
    return _EXAMPLE_STRINGS.get(name, "text")


def format_call(name: str, arguments: dict[str, Any], fmt: str) -> str:
    """Render one call as the model should write it in format fmt."""
    _check_fmt(fmt)
    if fmt == "hermes":
        return f"{_CALL_OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{_CALL_CLOSE}"
    lines = [_CALL_OPEN, f"{_FN_OPEN}{name}>"]
    for key, value in arguments.items():
        rendered = value if isinstance(value, str) else json.dumps(value)
        lines += [f"{_PARAM_OPEN}{key}>", rendered, _PARAM_CLOSE]
    lines += [_FN_CLOSE, _CALL_CLOSE]
    return "\n".join(lines)


def _example_call(tools: list[dict]) -> tuple[str, dict[str, Any]]:
    functions = list(_functions(tools).values())
    if not functions:
        return "TOOL_NAME", {"PARAMETER_NAME": "value"}
    # The tool with the fewest (but some) required parameters gives the shortest telling example.
    with_required = [fn for fn in functions if _properties(fn)[1]]
    fn = min(with_required, key=lambda f: len(_properties(f)[1])) if with_required else functions[0]
    return fn["name"], _example_arguments(fn)


def tool_format_instructions(tools: list[dict], fmt: str) -> str:
    """System-prompt section listing the tools and how to write a call in fmt, for servers that do not render tools."""
    _check_fmt(fmt)
    parts = ["# Tools", "", "You can call these tools:", ""]
    for fn in _functions(tools).values():
        parts.append(f"## {fn['name']}")
        description = (fn.get("description") or "").strip()
        if description:
            parts.append(description)
        parts += [_params_block(fn), ""]
    parts += ["# How to call a tool", ""]
    if fmt == "qwen3_coder":
        parts += [
            "Write each call in exactly this form:",
            "",
            f"{_CALL_OPEN}\n{_FN_OPEN}TOOL_NAME>\n{_PARAM_OPEN}PARAMETER_NAME>\nvalue\n{_PARAM_CLOSE}\n"
            f"{_PARAM_OPEN}OTHER_PARAMETER>\nvalue\n{_PARAM_CLOSE}\n{_FN_CLOSE}\n{_CALL_CLOSE}",
            "",
            "- Write one <parameter=NAME> block per argument; leave out optional parameters you do not need.",
            "- Write each value as plain text on the lines between its tags, exactly as it should arrive: "
            "no quotes and no escaping. Code keeps its indentation.",
            "- Write numbers and booleans plainly (5, true) and arrays or objects as JSON ([1, 10]).",
        ]
    else:
        parts += [
            "Write each call as one JSON object inside tags, in exactly this form:",
            "",
            _skeleton("hermes"),
            "",
            '- "arguments" is a JSON object mapping parameter names to values; leave out optional '
            "parameters you do not need.",
            "- It must be valid JSON: escape newlines in strings as \\n and double quotes as \\\".",
        ]
    parts += [
        "- You may make several calls in one reply: write one block per call. Text outside the blocks is "
        "read as your reasoning.",
        "",
        "Example:",
        format_call(*_example_call(tools), fmt),
    ]
    return "\n".join(parts)


def tool_call_json_schema(tools: list[dict]) -> dict[str, Any]:
    """A JSON schema matching exactly one valid call `{"name": ..., "arguments": {...}}` of one of the tools.

    Servers that constrain decoding by a schema (llama.cpp's `response_format`) then can only produce well-formed
    calls, which small models otherwise rarely manage."""
    variants = []
    for name, fn in _functions(tools).items():
        params = dict(fn.get("parameters") or {"type": "object", "properties": {}})
        params.setdefault("type", "object")
        variants.append({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": [name]}, "arguments": params},
            "required": ["name", "arguments"],
        })
    return {"anyOf": variants}
