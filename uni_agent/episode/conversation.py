"""One rollout's conversation: the messages sent to the model, and every way the agent loop adds to them.

The list is what the model sees next turn and what the result row keeps (`to_json`). Observations arrive here already
clipped (the tools clip their output to interaction.max_observation_chars, uni_agent.tools).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..llm import ChatReply
    from ..tool_calls import ToolCall

NO_TOOL_CALL_HINT = (
    "Your reply contained no tool call. Every reply must call exactly one of the tools "
    "(use `submit` when you are done)."
)


class Conversation:
    def __init__(self, prompt: list[dict[str, Any]], system_prompt: str | None = None):
        """The task's prompt messages (copied); an agent's own system prompt replaces the prompt's."""
        messages = [dict(m) for m in prompt]
        if system_prompt is not None:
            messages = [m for m in messages if m.get("role") != "system"]
            messages.insert(0, {"role": "system", "content": system_prompt})
        self.messages = messages

    def add_instructions(self, instructions: str) -> None:
        """Text the system prompt must carry (the tools, when they are described in the prompt)."""
        messages = self.messages
        if messages and messages[0].get("role") == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{instructions}"}
        else:
            messages.insert(0, {"role": "system", "content": instructions})

    def add_reply(self, reply: ChatReply) -> None:
        # What the model sampled, verbatim where the engine gives it (a server's chat parser may trim it): the next
        # prompt then continues the tokens of this one (uni_agent.episode.trajectory).
        said = reply.raw_text if reply.raw_text is not None and not reply.tool_calls else reply.content
        assistant: dict[str, Any] = {"role": "assistant", "content": said}
        if reply.tool_calls:
            assistant["tool_calls"] = reply.tool_calls
        self.messages.append(assistant)

    def add_observation(self, call: ToolCall, observation: str, structured: bool) -> None:
        """A tool's output: a tool message answering a structured call, else a user message naming the tool."""
        if structured:
            self.messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": observation})
        else:
            self.messages.append({"role": "user", "content": f"Observation from `{call.name}`:\n{observation}"})

    def add_error(self, reply: ChatReply, text: str) -> None:
        """An error the model can act on (a malformed tool call). Structured calls need one tool message per call id
        to keep the conversation well-formed."""
        ids = [c.get("id") for c in reply.tool_calls if isinstance(c, dict) and c.get("id")]
        if ids:
            self.messages.extend({"role": "tool", "tool_call_id": i, "content": text} for i in ids)
        else:
            self.messages.append({"role": "user", "content": text})

    def add_no_tool_call_hint(self) -> None:
        self.messages.append({"role": "user", "content": NO_TOOL_CALL_HINT})

    def to_json(self) -> str:
        return json.dumps(self.messages, ensure_ascii=False)
