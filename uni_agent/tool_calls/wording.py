"""How values and JSON errors are quoted in messages to the model: short, on one line, in terms it can act on."""

from __future__ import annotations

import json
from typing import Any


def describe(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"number {value}"
    if isinstance(value, str):
        return f"string {excerpt(value, 60)}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def excerpt(text: str, limit: int = 120) -> str:
    # json.dumps keeps the excerpt on one line and shows escapes the model can recognise.
    return json.dumps(text if len(text) <= limit else text[:limit] + "...")


def json_reason(e: json.JSONDecodeError) -> str:
    # Some json messages already end in " at" ("Invalid control character at").
    return f"{e.msg.removesuffix(' at')} at character {e.pos}"
