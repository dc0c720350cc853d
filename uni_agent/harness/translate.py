"""Function calling for a program whose engine reads tools from the prompt (interaction.tools_in: prompt).

The program speaks OpenAI function calling (`tools` in the request, `tool_calls` in the reply, `tool` messages with
the results). Some engines, and llama-server's token-in path, take the tools as text instead: the gateway then
describes the program's tools in the system prompt in the agent's text format (interaction.tool_parser: hermes,
qwen3_coder), parses the model's text reply into `tool_calls` with our parsers, and, when the program sends its
history back, puts the model's own text where the program has the parsed calls, and each tool result as the user
message our own loop would write (episode.conversation). The model therefore sees exactly the text it sampled: the
next call continues its tokens.
"""

from __future__ import annotations

import json
from typing import Any

from ..tool_calls import ToolCallFormatError, parse_text, tool_format_instructions


class PromptTools:
    """One rollout's translation state: the text the model wrote for each call id the gateway handed out."""

    def __init__(self, tool_parser: str):
        self.tool_parser = tool_parser
        self.said: dict[str, str] = {}  # call id -> the model's whole reply text
        self.names: dict[str, str] = {}  # call id -> tool name

    def to_engine(self, messages: list[dict[str, Any]], tools: list[dict]) -> list[dict[str, Any]]:
        """The program's messages as the engine should see them: tools described in the system prompt, the model's
        text in place of parsed calls, tool results as user messages."""
        out: list[dict[str, Any]] = []
        for message in messages:
            role = message.get("role")
            calls = message.get("tool_calls") or []
            if role == "assistant" and calls:
                said = self.said.get(calls[0].get("id", ""))
                out.append({"role": "assistant", "content": said if said is not None else _as_text(message)})
            elif role == "tool":
                name = message.get("name") or self.names.get(message.get("tool_call_id", ""), "tool")
                out.append({"role": "user", "content": f"Observation from `{name}`:\n{_text(message.get('content'))}"})
            else:
                out.append(message)
        instructions = tool_format_instructions(tools, self.tool_parser)
        if out and out[0].get("role") == "system" and isinstance(out[0].get("content"), str):
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
        return out

    def to_program(self, text: str, tools: list[dict]) -> tuple[str, list[dict[str, Any]]]:
        """The model's text reply as the program expects it: the thought as content and the calls as tool_calls. A
        reply whose calls cannot be read goes back as plain text (the program handles a reply without a call)."""
        try:
            parsed = parse_text(text, tools, self.tool_parser)
        except ToolCallFormatError:
            return text, []
        if not parsed.calls:
            return text, []
        tool_calls = [{"id": call.id, "type": "function",
                       "function": {"name": call.name, "arguments": json.dumps(call.arguments)}}
                      for call in parsed.calls]
        for call in parsed.calls:
            self.said[call.id] = text
            self.names[call.id] = call.name
        return parsed.thought, tool_calls


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _as_text(message: dict[str, Any]) -> str:
    """An assistant message with calls the gateway did not hand out (the program made them up): written as JSON."""
    calls = [{"name": (c.get("function") or {}).get("name"), "arguments": (c.get("function") or {}).get("arguments")}
             for c in message.get("tool_calls") or []]
    return f"{_text(message.get('content'))}\n{json.dumps(calls)}".strip()
