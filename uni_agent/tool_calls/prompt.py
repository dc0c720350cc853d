"""The system-prompt section of tools written as text: every tool with its parameters, then how to call one (the
format's own rules), then an example call. Used by the text formats' `instructions`."""

from __future__ import annotations

from .schemas import functions, params_block


def tools_section(tools: list[dict], how_to_call: list[str], example: str) -> str:
    parts = ["# Tools", "", "You can call these tools:", ""]
    for fn in functions(tools).values():
        parts.append(f"## {fn['name']}")
        description = (fn.get("description") or "").strip()
        if description:
            parts.append(description)
        parts += [params_block(fn), ""]
    parts += ["# How to call a tool", "", *how_to_call]
    parts += [
        "- You may make several calls in one reply: write one block per call. Text outside the blocks is "
        "read as your reasoning.",
        "",
        "Example:",
        example,
    ]
    return "\n".join(parts)
