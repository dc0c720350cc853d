"""Reading the tools' JSON schemas (OpenAI function form): parameters, type labels, and example values, for the
prompt section and the error messages that tell the model how to call a tool."""

from __future__ import annotations

import json
from typing import Any

# Placeholder values for common parameter names, so the example call looks like a real one.
_EXAMPLE_STRINGS = {"command": "ls -la", "path": "/path/to/file.py", "query": "search terms"}


def functions(tools: list[dict]) -> dict[str, dict]:
    """Map tool name -> function schema."""
    out: dict[str, dict] = {}
    for tool in tools:
        fn = tool.get("function", tool)  # also accept the unwrapped {"name", "parameters"} form
        out[fn["name"]] = fn
    return out


def properties(fn: dict) -> tuple[dict[str, dict], list[str], bool]:
    """(properties, required names, whether undeclared parameters are allowed)."""
    schema = fn.get("parameters") or {}
    props = schema.get("properties") or {}
    required = [r for r in schema.get("required") or [] if isinstance(r, str)]
    # JSON Schema allows extra keys by default, but for tool calls an unknown key is nearly always a typo,
    # so only an explicit additionalProperties lets them through.
    extra_ok = bool(schema.get("additionalProperties", False))
    return props, required, extra_ok


def types(schema: dict) -> list[str]:
    t = schema.get("type")
    if t is None:
        return []
    return [t] if isinstance(t, str) else [x for x in t if isinstance(x, str)]


def type_label(schema: dict) -> str:
    labels = []
    for t in types(schema):
        items = schema.get("items")
        if t == "array" and isinstance(items, dict) and types(items):
            labels.append(f"array of {type_label(items)}")
        else:
            labels.append(t)
    return " or ".join(labels) if labels else "any"


def _param_line(name: str, schema: dict, required: bool) -> str:
    facts = [type_label(schema), "required" if required else "optional"]
    if "enum" in schema:
        facts.append("one of: " + ", ".join(json.dumps(v) for v in schema["enum"]))
    line = f"- {name} ({'; '.join(facts)})"
    desc = (schema.get("description") or "").strip()
    if desc:
        # Indent continuation lines so a multi-line description stays under its parameter.
        line += ": " + desc.replace("\n", "\n  ")
    return line


def params_block(fn: dict) -> str:
    props, required, _ = properties(fn)
    if not props:
        return "Parameters: none (call it with no parameters)."
    lines = ["Parameters:"]
    lines += [_param_line(name, schema, name in required) for name, schema in props.items()]
    return "\n".join(lines)


def example_value(name: str, schema: dict) -> Any:
    if schema.get("examples"):
        return schema["examples"][0]
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    t = (types(schema) or ["string"])[0]
    if t == "integer":
        return 1
    if t == "number":
        return 1.5
    if t == "boolean":
        return True
    if t == "array":
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        return [example_value(name, items)] if items else []
    if t == "object":
        return {}
    return _EXAMPLE_STRINGS.get(name, "text")


def example_arguments(fn: dict | None) -> dict[str, Any]:
    if fn is None:
        return {"PARAMETER_NAME": "value"}
    props, required, _ = properties(fn)
    return {k: example_value(k, props.get(k, {})) for k in required}


def example_call(tools: list[dict]) -> tuple[str, dict[str, Any]]:
    fns = list(functions(tools).values())
    if not fns:
        return "TOOL_NAME", {"PARAMETER_NAME": "value"}
    # The tool with the fewest (but some) required parameters gives the shortest telling example.
    with_required = [fn for fn in fns if properties(fn)[1]]
    fn = min(with_required, key=lambda f: len(properties(f)[1])) if with_required else fns[0]
    return fn["name"], example_arguments(fn)
