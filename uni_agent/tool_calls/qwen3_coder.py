"""The qwen3_coder text format: XML-like tags, one per parameter, whose values are written as plain text (code needs
no escaping), the format Qwen3-Coder's chat template asks for:

    <tool_call>
    <function=execute_bash>
    <parameter=command>
    ls -la
    </parameter>
    </function>
    </tool_call>

The reader forgives what models commonly get wrong: a missing </parameter>, </function> or </tool_call>, a bare
<function=...> without <tool_call>, a value that itself contains "</parameter>".
"""

from __future__ import annotations

import json
from typing import Any

from .calls import ParsedReply, ToolCallFormatError
from .prompt import tools_section
from .schemas import example_call
from .text_format import finish_reply, malformed, skip_ws, strip_one_newline
from .wording import excerpt

_CALL_OPEN = "<tool_call>"
_CALL_CLOSE = "</tool_call>"
_FN_OPEN = "<function="
_FN_CLOSE = "</function>"
_PARAM_OPEN = "<parameter="
_PARAM_CLOSE = "</parameter>"

# Tags that may follow a closed parameter value.
_VALUE_FOLLOWERS = (_PARAM_OPEN, _FN_CLOSE, _CALL_CLOSE, _CALL_OPEN, _FN_OPEN)

# The bare shape of one call, appended to errors about malformed calls.
SKELETON = (
    f"{_CALL_OPEN}\n{_FN_OPEN}TOOL_NAME>\n{_PARAM_OPEN}PARAMETER_NAME>\nvalue\n{_PARAM_CLOSE}\n"
    f"{_FN_CLOSE}\n{_CALL_CLOSE}"
)

HOW_TO_CALL = [
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


class Qwen3CoderFormat:
    name = "qwen3_coder"

    def instructions(self, tools: list[dict]) -> str:
        return tools_section(tools, HOW_TO_CALL, self.format_call(*example_call(tools)))

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        lines = [_CALL_OPEN, f"{_FN_OPEN}{name}>"]
        for key, value in arguments.items():
            rendered = value if isinstance(value, str) else json.dumps(value)
            lines += [f"{_PARAM_OPEN}{key}>", rendered, _PARAM_CLOSE]
        lines += [_FN_CLOSE, _CALL_CLOSE]
        return "\n".join(lines)

    def parse(self, text: str, tools: list[dict]) -> ParsedReply:
        return _parse(text, tools)

    def decoding_schema(self, tools: list[dict]) -> dict[str, Any] | None:
        return None  # a tag format: no JSON schema describes it


FORMAT = Qwen3CoderFormat()


def _malformed(message: str) -> ToolCallFormatError:
    return malformed(message, SKELETON)


def _read_tag_name(text: str, pos: int, tag: str) -> tuple[str, int]:
    """Read NAME of `<tag=NAME>` starting just after "<tag="; return (NAME, position after ">")."""
    gt = text.find(">", pos)
    newline = text.find("\n", pos)
    if gt < 0 or 0 <= newline < gt:
        raise _malformed(
            f"The tag {excerpt('<' + tag + '=' + text[pos:pos + 40])} is not closed with \">\" on the same line.",
        )
    name = text[pos:gt].strip()
    if not name:
        raise _malformed(f"A <{tag}=...> tag has no name; write <{tag}=NAME>.")
    return name, gt + 1


def _read_value(text: str, start: int) -> tuple[str, int]:
    """Read a parameter value starting after `<parameter=KEY>`; return (raw value, position after it)."""
    first_close = -1
    search = start
    # Preferred end: a </parameter> followed by the next tag or the end of text, so a value whose code
    # itself contains "</parameter>" is not cut short.
    while (idx := text.find(_PARAM_CLOSE, search)) >= 0:
        if first_close < 0:
            first_close = idx
        after = skip_ws(text, idx + len(_PARAM_CLOSE))
        if after >= len(text) or text.startswith(_VALUE_FOLLOWERS, after):
            return text[start:idx], idx + len(_PARAM_CLOSE)
        search = idx + 1
    if first_close >= 0:
        return text[start:first_close], first_close + len(_PARAM_CLOSE)
    # No </parameter> at all: the model left it out; the value ends at the next tag or the end of text.
    ends = [i + 1 for i in [text.find("\n" + _PARAM_OPEN, start)] if i >= 0]  # keep "\n" for symmetric strip
    ends += [i for i in (text.find(_FN_CLOSE, start), text.find(_CALL_CLOSE, start)) if i >= 0]
    end = min(ends, default=len(text))
    return text[start:end], end


def _parse(text: str, tools: list[dict]) -> ParsedReply:
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
            cur = skip_ws(text, cur + len(_CALL_OPEN))
            if not text.startswith(_FN_OPEN, cur):
                found = excerpt(text[cur:cur + 60]) if cur < len(text) else "the end of your reply"
                raise _malformed(f"Expected <function=TOOL_NAME> right after {_CALL_OPEN}, but found {found}.")
        name, cur = _read_tag_name(text, cur + len(_FN_OPEN), "function")
        arguments: dict[str, str] = {}
        while True:
            cur = skip_ws(text, cur)
            if cur >= len(text) or text.startswith((_CALL_CLOSE, _CALL_OPEN, _FN_OPEN), cur):
                break  # a missing </function> is tolerated, also when the next call follows directly
            if text.startswith(_FN_CLOSE, cur):
                cur += len(_FN_CLOSE)
                break
            if not text.startswith(_PARAM_OPEN, cur):
                raise _malformed(
                    f"Inside <function={name}> expected <parameter=NAME> or {_FN_CLOSE}, "
                    f"but found {excerpt(text[cur:cur + 60])}.",
                )
            key, cur = _read_tag_name(text, cur + len(_PARAM_OPEN), "parameter")
            raw, cur = _read_value(text, cur)
            if key in arguments:
                raise _malformed(f"Parameter {json.dumps(key)} of tool {json.dumps(name)} is given twice; "
                                 "give each parameter once.")
            arguments[key] = strip_one_newline(raw)
        after = skip_ws(text, cur)
        if text.startswith(_CALL_CLOSE, after):
            cur = after + len(_CALL_CLOSE)
        # A missing </tool_call> is tolerated: whatever follows is ordinary text.
        raw_calls.append((name, arguments))
        pos = cur
    return finish_reply(thought, raw_calls, tools)

