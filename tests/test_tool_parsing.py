"""Tests for uni_agent.tool_calls: structured calls, both text formats, validation and the prompt section."""

from __future__ import annotations

import json
import re

import pytest

from uni_agent.tool_calls import (
    TEXT_FORMATS,
    ParsedReply,
    ToolCall,
    ToolCallFormatError,
    format_call,
    parse_structured,
    parse_text,
    tool_format_instructions,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "str_replace_editor",
            "description": "View, create and edit files.",
            "parameters": {
                "type": "object",
                "properties": {
                    "command": {
                        "type": "string",
                        "enum": ["view", "create", "str_replace", "insert", "undo_edit"],
                        "description": "The command to run.",
                    },
                    "path": {"type": "string", "description": "Absolute path to a file or directory."},
                    "file_text": {"type": "string", "description": "Content of the file to create."},
                    "old_str": {"type": "string", "description": "Exact text to replace."},
                    "new_str": {"type": "string", "description": "Replacement text."},
                    "insert_line": {"type": "integer", "description": "Line after which to insert."},
                    "view_range": {
                        "type": "array",
                        "items": {"type": "integer"},
                        "description": "Lines to view, e.g. [1, 10].",
                    },
                },
                "required": ["command", "path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "execute_bash",
            "description": "Run a bash command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The command."}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Submit the work.",
            "parameters": {"type": "object", "properties": {}, "required": []},
        },
    },
]

ALL_PARAMS = ["command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range"]


def structured(name: str, arguments, call_id: str = "call_abc") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def qwen_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


# --- structured -----------------------------------------------------------------------------------------


def test_structured_string_arguments_keep_id():
    calls = parse_structured([structured("execute_bash", '{"command": "ls -la"}', "call_1")], TOOLS)
    assert calls == [ToolCall(id="call_1", name="execute_bash", arguments={"command": "ls -la"})]


def test_structured_dict_arguments_and_coercion():
    calls = parse_structured(
        [structured("str_replace_editor", {"command": "view", "path": "/a.py", "view_range": "[1, 10]"})], TOOLS
    )
    assert calls[0].arguments == {"command": "view", "path": "/a.py", "view_range": [1, 10]}


def test_structured_empty_arguments_and_generated_id():
    entry = {"type": "function", "function": {"name": "submit", "arguments": ""}}
    (call,) = parse_structured([entry], TOOLS)
    assert call.name == "submit" and call.arguments == {}
    assert re.fullmatch(r"call_[0-9a-f]{8}", call.id)


def test_structured_double_encoded_arguments():
    double = json.dumps(json.dumps({"command": "pwd"}))
    (call,) = parse_structured([structured("execute_bash", double)], TOOLS)
    assert call.arguments == {"command": "pwd"}


def test_structured_bad_json_quotes_excerpt_and_expected_form():
    with pytest.raises(ToolCallFormatError) as err:
        parse_structured([structured("execute_bash", '{"command": "ls -la"')], TOOLS)
    msg = str(err.value)
    assert "not valid JSON" in msg
    assert '{\\"command\\": \\"ls -la\\"' in msg  # the excerpt, JSON-quoted
    assert '{"command": "ls -la"}' in msg  # the example of a correct arguments object


def test_structured_errors_of_several_calls_are_collected():
    entries = [
        structured("execute_bash", '{"command": "ls"}', "a"),
        structured("nope", "{}", "b"),
        structured("execute_bash", "{}", "c"),
    ]
    with pytest.raises(ToolCallFormatError) as err:
        parse_structured(entries, TOOLS)
    msg = str(err.value)
    assert "2 of the 3 tool calls" in msg
    assert "Tool call #2" in msg and "Tool call #3" in msg and "Tool call #1" not in msg


def test_structured_arguments_not_an_object():
    with pytest.raises(ToolCallFormatError, match="must be an object"):
        parse_structured([structured("execute_bash", "[1, 2]")], TOOLS)


# --- qwen3_coder ----------------------------------------------------------------------------------------


def test_qwen_single_call_with_thought():
    text = "Let me look at the repo.\n" + qwen_call("execute_bash", command="ls -la /repo")
    reply = parse_text(text, TOOLS, "qwen3_coder")
    assert reply.thought == "Let me look at the repo."
    assert len(reply.calls) == 1
    call = reply.calls[0]
    assert call.name == "execute_bash" and call.arguments == {"command": "ls -la /repo"}
    assert re.fullmatch(r"call_[0-9a-f]{8}", call.id)


def test_qwen_multiple_calls_and_text_between():
    text = (
        "First.\n"
        + qwen_call("execute_bash", command="pwd")
        + "\nThen.\n"
        + qwen_call("str_replace_editor", command="view", path="/repo/a.py")
        + "\nDone."
    )
    reply = parse_text(text, TOOLS, "qwen3_coder")
    assert [c.name for c in reply.calls] == ["execute_bash", "str_replace_editor"]
    assert reply.calls[1].arguments == {"command": "view", "path": "/repo/a.py"}
    assert reply.thought == "First.\nThen.\nDone."
    assert reply.calls[0].id != reply.calls[1].id


def test_qwen_multiline_code_keeps_indentation_and_blank_lines():
    code = "def f(x):\n    if x:\n        return 1\n\n    return 2\n"
    text = qwen_call("str_replace_editor", command="create", path="/repo/f.py", file_text=code)
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    # Only one newline each side belongs to the tags: the code's own trailing newline survives.
    assert call.arguments["file_text"] == code


def test_qwen_value_leading_spaces_preserved():
    text = qwen_call("str_replace_editor", command="str_replace", path="/a.py",
                     old_str="    x = 1", new_str="    x = 2\n    y = 3")
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments["old_str"] == "    x = 1"
    assert call.arguments["new_str"] == "    x = 2\n    y = 3"


def test_qwen_value_containing_closing_tag_text():
    code = 'print("</parameter>")'
    text = qwen_call("str_replace_editor", command="create", path="/a.py", file_text=code)
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments["file_text"] == code


def test_qwen_unclosed_call_followed_by_next_call():
    text = (
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls\n</parameter>\n"
        + qwen_call("execute_bash", command="pwd")
    )
    reply = parse_text(text, TOOLS, "qwen3_coder")
    assert [c.arguments["command"] for c in reply.calls] == ["ls", "pwd"]


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls -la\n</parameter>\n</function>\n",
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls -la\n</parameter>\n",
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls -la\n",
        "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls -la",
        "<function=execute_bash>\n<parameter=command>\nls -la\n</parameter>\n</function>",
    ],
)
def test_qwen_missing_closing_tags_tolerated(text):
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments == {"command": "ls -la"}


def test_qwen_value_containing_call_markup_is_kept_whole():
    # Well-formed calls win over guessing at a forgotten </parameter>: a file that itself holds tool-call
    # markup (e.g. a test for this parser) must arrive intact.
    content = 'text = """\n<parameter=path>\n/a.py\n</parameter>\n"""'
    text = qwen_call("str_replace_editor", command="create", path="/t.py", file_text=content)
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments == {"command": "create", "path": "/t.py", "file_text": content}


def test_qwen_missing_parameter_close_without_any_close_tag():
    text = "<tool_call>\n<function=str_replace_editor>\n<parameter=command>\nview\n<parameter=path>\n/a.py\n</function>"
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments == {"command": "view", "path": "/a.py"}


def test_qwen_type_coercion():
    text = qwen_call("str_replace_editor", command="insert", path="/a.py", insert_line="12", new_str="x = 1")
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments["insert_line"] == 12 and isinstance(call.arguments["insert_line"], int)

    for raw in ("[1, 10]", "[1,10]", "(1, 10)"):
        text = qwen_call("str_replace_editor", command="view", path="/a.py", view_range=raw)
        (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
        assert call.arguments["view_range"] == [1, 10]

    # A value that needs coercion per item.
    text = qwen_call("str_replace_editor", command="view", path="/a.py", view_range='["1", "-1"]')
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments["view_range"] == [1, -1]


def test_qwen_null_literal_for_non_string():
    text = qwen_call("str_replace_editor", command="view", path="/a.py", view_range="null")
    (call,) = parse_text(text, TOOLS, "qwen3_coder").calls
    assert call.arguments["view_range"] is None
    # For a string parameter "null" is just text.
    (call,) = parse_text(qwen_call("execute_bash", command="null"), TOOLS, "qwen3_coder").calls
    assert call.arguments["command"] == "null"


def test_bool_and_number_coercion():
    tools = TOOLS + [{
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search.",
            "parameters": {
                "type": "object",
                "properties": {
                    "regex": {"type": "boolean"},
                    "threshold": {"type": "number"},
                    "options": {"type": "object"},
                },
                "required": ["regex"],
            },
        },
    }]
    text = qwen_call("search", regex="True", threshold="0.5", options='{"a": 1}')
    (call,) = parse_text(text, tools, "qwen3_coder").calls
    assert call.arguments == {"regex": True, "threshold": 0.5, "options": {"a": 1}}
    (call,) = parse_text(qwen_call("search", regex="false"), tools, "qwen3_coder").calls
    assert call.arguments == {"regex": False}
    with pytest.raises(ToolCallFormatError, match='"regex" must be boolean'):
        parse_text(qwen_call("search", regex="maybe"), tools, "qwen3_coder")


def test_qwen_submit_without_parameters():
    reply = parse_text("All done.\n<tool_call>\n<function=submit>\n</function>\n</tool_call>", TOOLS, "qwen3_coder")
    assert reply.thought == "All done."
    assert reply.calls[0].name == "submit" and reply.calls[0].arguments == {}


def test_qwen_malformed_inside_tool_call_shows_format():
    text = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>'
    with pytest.raises(ToolCallFormatError) as err:
        parse_text(text, TOOLS, "qwen3_coder")
    msg = str(err.value)
    assert "<function=TOOL_NAME>" in msg and "<parameter=PARAMETER_NAME>" in msg


def test_qwen_duplicate_parameter_rejected():
    text = "<tool_call>\n<function=execute_bash>\n<parameter=command>\nls\n</parameter>\n<parameter=command>\npwd\n</parameter>\n</function>\n</tool_call>"
    with pytest.raises(ToolCallFormatError, match="given twice"):
        parse_text(text, TOOLS, "qwen3_coder")


# --- hermes ---------------------------------------------------------------------------------------------


def test_hermes_blocks_with_thought():
    text = (
        "Checking.\n"
        '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n</tool_call>\n'
        "and\n"
        '<tool_call>{"name": "str_replace_editor", "arguments": {"command": "view", "path": "/a.py", '
        '"view_range": [3, 9]}}</tool_call>'
    )
    reply = parse_text(text, TOOLS, "hermes")
    assert reply.thought == "Checking.\nand"
    assert [c.name for c in reply.calls] == ["execute_bash", "str_replace_editor"]
    assert reply.calls[1].arguments["view_range"] == [3, 9]


def test_hermes_arguments_as_json_string():
    inner = json.dumps({"command": "echo 'hi'\ncat x"})
    text = "<tool_call>" + json.dumps({"name": "execute_bash", "arguments": inner}) + "</tool_call>"
    (call,) = parse_text(text, TOOLS, "hermes").calls
    assert call.arguments == {"command": "echo 'hi'\ncat x"}


def test_raw_newlines_inside_json_strings_accepted():
    # Models often put real newlines into JSON strings when writing code; they mean newlines.
    text = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "cd /repo\n  ls"}}\n</tool_call>'
    (call,) = parse_text(text, TOOLS, "hermes").calls
    assert call.arguments == {"command": "cd /repo\n  ls"}
    (call,) = parse_structured([structured("execute_bash", '{"command": "a\nb"}')], TOOLS)
    assert call.arguments == {"command": "a\nb"}


def test_hermes_one_extra_closing_brace_forgiven():
    text = '<tool_call>{"name": "execute_bash", "arguments": {"command": "ls"}}}</tool_call>'
    (call,) = parse_text(text, TOOLS, "hermes").calls
    assert call.arguments == {"command": "ls"}


def test_hermes_missing_close_at_end_tolerated():
    text = 'Run it.\n<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n'
    reply = parse_text(text, TOOLS, "hermes")
    assert reply.thought == "Run it."
    assert reply.calls[0].arguments == {"command": "ls"}


def test_hermes_missing_close_with_broken_json_is_error():
    text = '<tool_call>\n{"name": "execute_bash", "arguments": {"command": "ls"'
    with pytest.raises(ToolCallFormatError) as err:
        parse_text(text, TOOLS, "hermes")
    assert "</tool_call>" in str(err.value) and "not valid JSON" in str(err.value)


def test_hermes_missing_close_before_next_call_is_error():
    text = (
        '<tool_call>{"name": "execute_bash", "arguments": {"command": "ls"}}\n'
        '<tool_call>{"name": "execute_bash", "arguments": {"command": "pwd"}}</tool_call>'
    )
    with pytest.raises(ToolCallFormatError, match="not closed"):
        parse_text(text, TOOLS, "hermes")


def test_hermes_invalid_json_quotes_excerpt_and_format():
    text = "<tool_call>{'name': 'execute_bash', 'arguments': {'command': 'ls'}}</tool_call>"
    with pytest.raises(ToolCallFormatError) as err:
        parse_text(text, TOOLS, "hermes")
    msg = str(err.value)
    assert "not valid JSON" in msg
    assert "{'name': 'execute_bash'" in msg  # excerpt of what the model wrote
    assert '{"name": "TOOL_NAME", "arguments"' in msg  # the expected format


def test_hermes_bare_json_reply():
    reply = parse_text('  {"name": "execute_bash", "arguments": {"command": "ls"}}\n', TOOLS, "hermes")
    assert reply == ParsedReply(thought="", calls=[reply.calls[0]])
    assert reply.calls[0].name == "execute_bash" and reply.calls[0].arguments == {"command": "ls"}


def test_hermes_fenced_json_reply():
    text = 'I will list files.\n```json\n{"name": "execute_bash", "arguments": {"command": "ls"}}\n```\n'
    reply = parse_text(text, TOOLS, "hermes")
    assert reply.thought == "I will list files."
    assert reply.calls[0].arguments == {"command": "ls"}


def test_hermes_plain_json_answer_is_not_a_call():
    reply = parse_text('{"status": "ok"}', TOOLS, "hermes")
    assert reply.calls == [] and reply.thought == '{"status": "ok"}'


def test_hermes_broken_bare_json_call_is_error():
    with pytest.raises(ToolCallFormatError, match="not valid JSON"):
        parse_text('{"name": "execute_bash", "arguments": {"command": "ls"}', TOOLS, "hermes")


@pytest.mark.parametrize("fmt", TEXT_FORMATS.names())
def test_no_call_reply(fmt):
    text = "  I think the bug is in parse().\nNo tool needed yet.  "
    assert parse_text(text, TOOLS, fmt) == ParsedReply(thought=text.strip(), calls=[])


def test_unknown_format_rejected():
    with pytest.raises(ValueError, match="qwen3_coder"):
        parse_text("hi", TOOLS, "xml")


# --- validation (same messages from every path) ---------------------------------------------------------


def _errors_from_all_paths(name: str, arguments: dict) -> list[str]:
    """Run one call through the structured path and both text formats; return the three error messages."""
    messages = []
    with pytest.raises(ToolCallFormatError) as err:
        parse_structured([structured(name, json.dumps(arguments))], TOOLS)
    messages.append(str(err.value))
    for fmt in TEXT_FORMATS.names():
        with pytest.raises(ToolCallFormatError) as err:
            parse_text(format_call(name, arguments, fmt), TOOLS, fmt)
        messages.append(str(err.value))
    return messages


def test_unknown_tool_lists_available():
    for msg in _errors_from_all_paths("run_shell", {"command": "ls"}):
        assert '"run_shell"' in msg
        assert "str_replace_editor, execute_bash, submit" in msg


def test_unknown_parameter_lists_allowed():
    for msg in _errors_from_all_paths("execute_bash", {"command": "ls", "cwd": "/repo"}):
        assert 'Unknown parameter "cwd"' in msg and "Allowed parameters: command" in msg


def test_parameter_on_tool_without_parameters():
    for msg in _errors_from_all_paths("submit", {"reason": "done"}):
        assert 'Unknown parameter "reason"' in msg and "no parameters" in msg


def test_missing_required_parameter():
    for msg in _errors_from_all_paths("str_replace_editor", {"command": "view"}):
        assert 'Missing required parameter "path"' in msg
        assert "Fix these" in msg


def test_wrong_type_names_parameter_and_type():
    for msg in _errors_from_all_paths("str_replace_editor", {"command": "insert", "path": "/a", "insert_line": "ten"}):
        assert '"insert_line" must be integer' in msg and '"ten"' in msg
    for msg in _errors_from_all_paths("str_replace_editor", {"command": "view", "path": "/a", "view_range": "1 to 10"}):
        assert '"view_range" must be array of integer' in msg
    for msg in _errors_from_all_paths("str_replace_editor", {"command": "view", "path": "/a", "view_range": ["a", 2]}):
        assert '"view_range" item 0 must be integer' in msg


def test_enum_violation_lists_allowed_values():
    for msg in _errors_from_all_paths("str_replace_editor", {"command": "edit", "path": "/a"}):
        assert '"command"' in msg and '"edit"' in msg
        assert '"view", "create", "str_replace", "insert", "undo_edit"' in msg


def test_several_problems_of_one_call_reported_together():
    with pytest.raises(ToolCallFormatError) as err:
        parse_structured([structured("str_replace_editor", {"command": "edit", "cwd": "/"})], TOOLS)
    msg = str(err.value)
    assert '"edit"' in msg and 'Unknown parameter "cwd"' in msg and 'Missing required parameter "path"' in msg


def test_required_null_rejected():
    with pytest.raises(ToolCallFormatError, match='Required parameter "command" is null'):
        parse_structured([structured("execute_bash", '{"command": null}')], TOOLS)


def test_json_number_for_integer_and_float_integral():
    (call,) = parse_structured(
        [structured("str_replace_editor", {"command": "insert", "path": "/a", "insert_line": 3.0, "new_str": "x"})],
        TOOLS,
    )
    assert call.arguments["insert_line"] == 3 and isinstance(call.arguments["insert_line"], int)
    with pytest.raises(ToolCallFormatError, match='"insert_line" must be integer'):
        parse_structured([structured("str_replace_editor", {"command": "insert", "path": "/a", "insert_line": 2.5})],
                         TOOLS)
    with pytest.raises(ToolCallFormatError, match='"insert_line" must be integer'):
        parse_structured([structured("str_replace_editor", {"command": "insert", "path": "/a", "insert_line": True})],
                         TOOLS)


# --- prompt section -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", TEXT_FORMATS.names())
def test_instructions_mention_every_tool_and_parameter(fmt):
    text = tool_format_instructions(TOOLS, fmt)
    for tool in TOOLS:
        assert tool["function"]["name"] in text
        assert tool["function"]["description"] in text
    for param in ALL_PARAMS:
        assert param in text
    assert "<tool_call>" in text and "</tool_call>" in text
    assert '"undo_edit"' in text  # enum values
    assert "required" in text and "array of integer" in text


def test_instructions_show_format_specific_syntax():
    assert "<function=TOOL_NAME>" in tool_format_instructions(TOOLS, "qwen3_coder")
    assert "<function=" not in tool_format_instructions(TOOLS, "hermes")
    assert '"arguments"' in tool_format_instructions(TOOLS, "hermes")


@pytest.mark.parametrize("fmt", TEXT_FORMATS.names())
def test_instruction_example_parses_as_valid_call(fmt):
    text = tool_format_instructions(TOOLS, fmt)
    example = text.split("Example:\n", 1)[1]
    (call,) = parse_text(example, TOOLS, fmt).calls
    assert call.name == "execute_bash" and call.arguments == {"command": "ls -la"}


@pytest.mark.parametrize("fmt", TEXT_FORMATS.names())
def test_format_call_round_trip(fmt):
    args = {"command": "create", "path": "/a.py", "file_text": 'x = "a"\n    y = 2\n', "view_range": [1, 2]}
    (call,) = parse_text(format_call("str_replace_editor", args, fmt), TOOLS, fmt).calls
    assert call.arguments == args
