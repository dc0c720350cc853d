"""The one validator of every tool call, structured or written as text: check the call against the tool's JSON
schema and coerce its arguments (models write "5" for 5, [1, 2] as a string, a Python list for a JSON one).

A small JSON-schema subset, the part tool definitions use: type (also a list of types), items, properties, enum,
required, additionalProperties. Every problem becomes a ToolCallFormatError worded for the model.
"""

from __future__ import annotations

import ast
import json
import math
import re
from typing import Any

from .calls import ToolCall, ToolCallFormatError, new_call_id
from .schemas import functions, params_block, properties, type_label
from .schemas import types as schema_types
from .wording import describe

_INT_RE = re.compile(r"[+-]?\d+")


class _CoerceError(Exception):
    """Internal: a value does not fit its schema; the message says what was expected."""


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
    types = schema_types(schema)
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
                raise _CoerceError(f"{where} must be {type_label(schema)}, but got {describe(value)}.")
        items = schema.get("items")
        if chosen == "array" and isinstance(items, dict):
            result = [_coerce(v, items, f"{where} item {i}") for i, v in enumerate(result)]
        props = schema.get("properties")
        if chosen == "object" and isinstance(props, dict):
            result = {k: _coerce(v, props[k], f"{where} field {json.dumps(k)}") if k in props else v
                      for k, v in result.items()}
    if "enum" in schema and result not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        raise _CoerceError(f"{where} is {describe(result)}, which is not allowed; use one of: {allowed}.")
    return result


def validate_call(name: Any, arguments: Any, tools: list[dict], call_id: str | None = None) -> ToolCall:
    """Check a call against the tool schemas and coerce its arguments; the one validator of all paths.

    Raises ToolCallFormatError naming every problem of the call and how to fix it.
    """
    by_name = functions(tools)
    available = ", ".join(by_name) or "(none)"
    if not isinstance(name, str) or not name.strip():
        raise ToolCallFormatError(
            f"The tool call has no tool name. Name one of the available tools: {available}."
        )
    fn = by_name.get(name.strip())
    if fn is None:
        raise ToolCallFormatError(
            f"Unknown tool {json.dumps(name)}. Available tools: {available}. "
            "Call one of these, spelled exactly as listed."
        )
    name = fn["name"]
    if not isinstance(arguments, dict):
        raise ToolCallFormatError(
            f"The arguments of tool {json.dumps(name)} must be an object that maps parameter names to values, "
            f"but got {describe(arguments)}.\n{params_block(fn)}"
        )
    props, required, extra_ok = properties(fn)
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
            + f"\nFix these and call the tool again.\n{params_block(fn)}"
        )
    return ToolCall(id=call_id or new_call_id(), name=name, arguments=coerced)


def raise_collected(problems: list[tuple[int, str]], total: int) -> None:
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

