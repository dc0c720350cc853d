"""str_replace_editor against a real bubblewrap LocalSandbox: every command, every refusal, exact bytes."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from uni_agent.sandbox import read_file
from uni_agent.sandbox.local import LocalDeploymentConfig
from uni_agent.tools.editor import EditorError, StrReplaceEditor

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

WORKDIR = "/testbed"
MAIN_PY = "def add(a, b):\n\treturn a + b\n\n\ndef sub(a, b):\n\treturn a - b\n"
NO_NEWLINE = "first\nsecond\nthird"  # no trailing newline, on purpose
LATIN1 = "caf\xe9 = 1\nna\xefve = 2\n".encode("latin-1")  # not valid UTF-8


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small repository for the module; each test gets its own copy-on-write sandbox over it."""
    root = tmp_path_factory.mktemp("editor")
    # Keep the snapshot cache and sandbox dirs out of the user's home and /tmp.
    saved = {key: os.environ.get(key) for key in ("UNI_AGENT_CACHE_DIR", "UNI_AGENT_SANDBOX_ROOT")}
    os.environ["UNI_AGENT_CACHE_DIR"] = str(root / "cache")
    os.environ["UNI_AGENT_SANDBOX_ROOT"] = str(root / "sandboxes")
    repo = root / "repo"
    (repo / "pkg" / "deep" / "deeper").mkdir(parents=True)
    (repo / "main.py").write_text(MAIN_PY)
    (repo / "notes.txt").write_text(NO_NEWLINE)
    (repo / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (repo / "latin1.txt").write_bytes(LATIN1)
    (repo / "dup.py").write_text("x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n")
    (repo / "pkg" / "__init__.py").write_text("")
    (repo / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (repo / "pkg" / "deep" / "level2.py").write_text("")
    (repo / "pkg" / "deep" / "deeper" / "level3.py").write_text("")
    (repo / ".hidden").write_text("secret\n")
    (repo / "escape").symlink_to("/etc/hostname")
    (repo / "escape_dir").symlink_to("/etc")
    (repo / "alias.py").symlink_to("main.py")  # a link that stays inside the workspace
    yield repo
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def run(repo: Path, body: Callable[[StrReplaceEditor, Any], Awaitable[Any]], **editor_kwargs: Any) -> Any:
    """Start a sandbox on `repo`, run `body(editor, sandbox)`, and always close the sandbox."""

    async def main() -> Any:
        sandbox = LocalDeploymentConfig(repo=str(repo)).build(env_variables={}, name="editor-test")
        async with sandbox:  # type: ignore[attr-defined]
            return await body(StrReplaceEditor(sandbox, **editor_kwargs), sandbox)

    return asyncio.run(main())


async def cat(sandbox: Any, path: str) -> bytes:
    return await read_file(sandbox, path)


async def exists(sandbox: Any, path: str) -> bool:
    return (await sandbox.exec(f"test -e {path}", 30)).exit_code == 0


async def error_of(editor: StrReplaceEditor, **arguments: Any) -> str:
    with pytest.raises(EditorError) as info:
        await editor(arguments)
    return str(info.value)


# -- schema and argument checking ------------------------------------------------------------------------------
def test_schema_shape() -> None:
    function = StrReplaceEditor.SCHEMA["function"]
    assert StrReplaceEditor.SCHEMA["type"] == "function"
    assert function["name"] == "str_replace_editor"
    params = function["parameters"]
    assert params["required"] == ["command", "path"]
    assert params["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert", "undo_edit"]
    assert params["properties"]["insert_line"]["type"] == "integer"
    assert params["properties"]["view_range"]["items"]["type"] == "integer"
    for name in ("path", "file_text", "old_str", "new_str"):
        assert params["properties"][name]["type"] == "string"


def test_bad_commands_and_missing_arguments(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        message = await error_of(editor, command="delete", path="main.py")
        assert "delete" in message
        for command in ("view", "create", "str_replace", "insert", "undo_edit"):
            assert command in message
        assert "command" in await error_of(editor, path="main.py")
        assert "`path`" in await error_of(editor, command="view")
        assert "`file_text`" in await error_of(editor, command="create", path="new.py")
        assert "`old_str`" in await error_of(editor, command="str_replace", path="main.py")
        assert "`insert_line`" in await error_of(editor, command="insert", path="main.py", new_str="x")
        assert "`new_str`" in await error_of(editor, command="insert", path="main.py", insert_line=1)
        assert "integer" in await error_of(editor, command="insert", path="main.py", insert_line="one", new_str="x")
        assert "string" in await error_of(editor, command="create", path="new.py", file_text=5)
        assert "empty" in await error_of(editor, command="str_replace", path="main.py", old_str="")

    run(repo, body)


# -- view ------------------------------------------------------------------------------------------------------
def test_view_file_numbers_lines_like_cat_n(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        out = await editor({"command": "view", "path": "main.py"})
        expected = "\n".join(f"{n:6}\t{line}" for n, line in enumerate(MAIN_PY.split("\n")[:-1], start=1))
        assert out.endswith(expected)
        assert "     2\t\treturn a + b" in out  # tab in the file kept as is
        # The same file by absolute path, and the file's own cat -n agrees.
        assert await editor({"command": "view", "path": f"{WORKDIR}/main.py"}) == out
        cat_n = (await sandbox.exec("cat -n main.py", 30)).stdout.decode()
        assert out.endswith(cat_n.rstrip("\n"))

        part = await editor({"command": "view", "path": "main.py", "view_range": [2, 3]})
        assert "     2\t\treturn a + b\n     3\t" in part and "     1\t" not in part and "     4\t" not in part
        tail = await editor({"command": "view", "path": "main.py", "view_range": [5, -1]})
        assert "     5\tdef sub(a, b):" in tail and "     6\t\treturn a - b" in tail and "     4\t" not in tail
        # No trailing newline: the last line still shows, and nothing extra appears.
        notes = await editor({"command": "view", "path": "notes.txt"})
        assert notes.endswith("     3\tthird")
        assert "empty" in await editor({"command": "view", "path": "pkg/__init__.py"})

    run(repo, body)


def test_view_range_errors(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        async def bad(view_range: Any, path: str = "main.py") -> str:
            return await error_of(editor, command="view", path=path, view_range=view_range)

        assert "two integers" in await bad([1])
        assert "two integers" in await bad([1, 2, 3])
        assert "two integers" in await bad(["a", 2])
        assert "two integers" in await bad(5)
        assert "start 0" in await bad([0, 3])
        assert "start 7" in await bad([7, -1]) and "6 lines" in await bad([7, -1])
        assert "before start" in await bad([4, 2])
        assert "past the end" in await bad([2, 99]) and "6 lines" in await bad([2, 99])
        assert "directory" in await bad([1, 2], path="pkg")
        assert "empty" in await bad([1, 1], path="pkg/__init__.py")

    run(repo, body)


def test_view_directory_two_levels_without_hidden(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        out = await editor({"command": "view", "path": "."})
        lines = out.splitlines()
        assert WORKDIR in lines[0]
        for entry in ("main.py", "pkg/", "pkg/mod.py", "pkg/deep/", "escape", "latin1.txt"):
            assert f"{WORKDIR}/{entry}" in lines
        assert f"{WORKDIR}/pkg/deep/level2.py" not in lines  # third level
        assert not any("/." in line for line in lines[1:])  # .hidden and .git
        sub = await editor({"command": "view", "path": "pkg"})
        assert f"{WORKDIR}/pkg/deep/level2.py" in sub.splitlines()
        assert f"{WORKDIR}/pkg/deep/deeper/level3.py" not in sub

    run(repo, body)


def test_view_clips_long_output(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        await editor({"command": "create", "path": "long.txt", "file_text": "".join(f"line {i}\n" for i in range(500))})
        out = await editor({"command": "view", "path": "long.txt"})
        assert len(out) < 600
        assert "clipped" in out and "view_range" in out
        assert "     1\tline 0" in out and "line 499" not in out
        listing = await StrReplaceEditor(sandbox, max_view_chars=100)({"command": "view", "path": "."})
        assert "clipped" in listing and "subdirectory" in listing
        # A single line longer than the limit is cut, not dropped.
        await editor({"command": "create", "path": "wide.txt", "file_text": "x" * 1000})
        wide = await editor({"command": "view", "path": "wide.txt"})
        assert "     1\txxx" in wide and "too long" in wide and len(wide) < 600

    run(repo, body, max_view_chars=300)


# -- create ----------------------------------------------------------------------------------------------------
def test_create_writes_exact_bytes_and_refuses_existing(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        text = "a\tb\r\nno newline at end ünïcode"
        out = await editor({"command": "create", "path": "new/dir/file.txt", "file_text": text})
        assert f"{WORKDIR}/new/dir/file.txt" in out
        assert await cat(sandbox, f"{WORKDIR}/new/dir/file.txt") == text.encode()
        message = await error_of(editor, command="create", path="main.py", file_text="x")
        assert "already exists" in message and "str_replace" in message
        assert await cat(sandbox, f"{WORKDIR}/main.py") == MAIN_PY.encode()
        assert "already exists" in await error_of(editor, command="create", path="pkg", file_text="x")
        await editor({"command": "create", "path": "empty.txt", "file_text": ""})
        assert await cat(sandbox, f"{WORKDIR}/empty.txt") == b""

    run(repo, body)


# -- str_replace -----------------------------------------------------------------------------------------------
def test_str_replace_success_preserves_other_bytes(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        out = await editor({"command": "str_replace", "path": "main.py", "old_str": "\treturn a - b",
                            "new_str": "\tresult = a - b\n\treturn result"})
        assert "     6\t\tresult = a - b" in out and "     7\t\treturn result" in out
        assert "review" in out.lower()
        assert await cat(sandbox, f"{WORKDIR}/main.py") == MAIN_PY.replace(
            "\treturn a - b", "\tresult = a - b\n\treturn result").encode()

        # No trailing newline stays without one; CRLF endings untouched.
        await editor({"command": "str_replace", "path": "notes.txt", "old_str": "second", "new_str": "2nd"})
        assert await cat(sandbox, f"{WORKDIR}/notes.txt") == b"first\n2nd\nthird"
        await editor({"command": "str_replace", "path": "crlf.txt", "old_str": "two", "new_str": "TWO"})
        assert await cat(sandbox, f"{WORKDIR}/crlf.txt") == b"one\r\nTWO\r\n"

        # new_str defaults to "": the text is deleted.
        await editor({"command": "str_replace", "path": "notes.txt", "old_str": "first\n"})
        assert await cat(sandbox, f"{WORKDIR}/notes.txt") == b"2nd\nthird"

    run(repo, body)


def test_str_replace_no_match_and_multiple_matches(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        message = await error_of(editor, command="str_replace", path="main.py",
                                 old_str="    return a + b", new_str="pass")  # spaces, but the file has a tab
        assert "not found verbatim" in message and "whitespace" in message and "indentation" in message
        assert "CRLF" in await error_of(editor, command="str_replace", path="crlf.txt", old_str="one\ntwo")

        message = await error_of(editor, command="str_replace", path="dup.py", old_str="x = 1", new_str="x = 9")
        assert "3 times" in message and "1, 3, 5" in message
        # Two matches exactly, found by line.
        message = await error_of(editor, command="str_replace", path="main.py", old_str="(a, b):", new_str="()")
        assert "2 times" in message and "lines 1, 5" in message
        # Nothing changed by the refusals.
        assert await cat(sandbox, f"{WORKDIR}/dup.py") == b"x = 1\ny = 2\nx = 1\nz = 3\nx = 1\n"
        assert await cat(sandbox, f"{WORKDIR}/main.py") == MAIN_PY.encode()
        # Enough context makes it unique.
        await editor({"command": "str_replace", "path": "dup.py", "old_str": "z = 3\nx = 1", "new_str": "z = 3\nx = 9"})
        assert await cat(sandbox, f"{WORKDIR}/dup.py") == b"x = 1\ny = 2\nx = 1\nz = 3\nx = 9\n"

    run(repo, body)


# -- insert ----------------------------------------------------------------------------------------------------
def test_insert_positions_and_range(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        out = await editor({"command": "insert", "path": "main.py", "insert_line": 0, "new_str": "import os"})
        assert "     1\timport os" in out and "     2\tdef add(a, b):" in out
        assert await cat(sandbox, f"{WORKDIR}/main.py") == ("import os\n" + MAIN_PY).encode()

        await editor({"command": "insert", "path": "main.py", "insert_line": 3, "new_str": "\n# gap\n"})
        lines = (await cat(sandbox, f"{WORKDIR}/main.py")).decode().split("\n")
        assert lines[2:6] == ["\treturn a + b", "", "# gap", ""]

        # After the last line of a file without a trailing newline.
        await editor({"command": "insert", "path": "notes.txt", "insert_line": 3, "new_str": "fourth"})
        assert await cat(sandbox, f"{WORKDIR}/notes.txt") == b"first\nsecond\nthird\nfourth"
        await editor({"command": "insert", "path": "notes.txt", "insert_line": 1, "new_str": "1.5"})
        assert await cat(sandbox, f"{WORKDIR}/notes.txt") == b"first\n1.5\nsecond\nthird\nfourth"
        await editor({"command": "insert", "path": "crlf.txt", "insert_line": 2, "new_str": "three\r\n"})
        assert await cat(sandbox, f"{WORKDIR}/crlf.txt") == b"one\r\ntwo\r\nthree\r\n"

        message = await error_of(editor, command="insert", path="notes.txt", insert_line=6, new_str="x")
        assert "out of range" in message and "5 lines" in message
        assert "out of range" in await error_of(editor, command="insert", path="notes.txt", insert_line=-1,
                                                new_str="x")
        assert "nothing to insert" in await error_of(editor, command="insert", path="notes.txt", insert_line=1,
                                                     new_str="")

    run(repo, body)


# -- undo_edit -------------------------------------------------------------------------------------------------
def test_undo_after_str_replace_insert_and_create(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        assert "no edit" in await error_of(editor, command="undo_edit", path="main.py")

        await editor({"command": "str_replace", "path": "main.py", "old_str": "a + b", "new_str": "b + a"})
        # Edited by relative path, undone by absolute path (and via ./ and ..): one history key.
        await editor({"command": "insert", "path": f"{WORKDIR}/main.py", "insert_line": 0, "new_str": "# top"})
        after_replace = MAIN_PY.replace("a + b", "b + a").encode()
        out = await editor({"command": "undo_edit", "path": f"{WORKDIR}/./pkg/../main.py"})
        assert "Undid" in out
        assert await cat(sandbox, f"{WORKDIR}/main.py") == after_replace
        await editor({"command": "undo_edit", "path": "main.py"})
        assert await cat(sandbox, f"{WORKDIR}/main.py") == MAIN_PY.encode()
        assert "no edit" in await error_of(editor, command="undo_edit", path="main.py")

        # An edit through a symlink inside the workspace is undone through the real name.
        await editor({"command": "str_replace", "path": "alias.py", "old_str": "def sub", "new_str": "def minus"})
        assert b"def minus" in await cat(sandbox, f"{WORKDIR}/main.py")
        await editor({"command": "undo_edit", "path": "main.py"})
        assert await cat(sandbox, f"{WORKDIR}/main.py") == MAIN_PY.encode()

        # Undoing a create removes the file; undoing again has nothing left.
        await editor({"command": "create", "path": "made.py", "file_text": "x = 1\n"})
        await editor({"command": "str_replace", "path": "made.py", "old_str": "1", "new_str": "2"})
        await editor({"command": "undo_edit", "path": f"{WORKDIR}/made.py"})
        assert await cat(sandbox, f"{WORKDIR}/made.py") == b"x = 1\n"
        out = await editor({"command": "undo_edit", "path": "made.py"})
        assert "removed" in out
        assert not await exists(sandbox, f"{WORKDIR}/made.py")
        assert "no edit" in await error_of(editor, command="undo_edit", path="made.py")

        # Undo restores bytes exactly (CRLF, no trailing newline).
        await editor({"command": "str_replace", "path": "crlf.txt", "old_str": "one\r\n", "new_str": ""})
        await editor({"command": "insert", "path": "notes.txt", "insert_line": 3, "new_str": "more"})
        await editor({"command": "undo_edit", "path": "crlf.txt"})
        await editor({"command": "undo_edit", "path": "notes.txt"})
        assert await cat(sandbox, f"{WORKDIR}/crlf.txt") == b"one\r\ntwo\r\n"
        assert await cat(sandbox, f"{WORKDIR}/notes.txt") == NO_NEWLINE.encode()

    run(repo, body)


# -- paths -----------------------------------------------------------------------------------------------------
def test_paths_outside_the_workspace_are_refused(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        cases = [
            {"command": "view", "path": "../etc/passwd"},
            {"command": "view", "path": "pkg/../../etc/passwd"},
            {"command": "view", "path": "/etc/passwd"},
            {"command": "view", "path": "/testbedX/file"},  # shares a prefix, is not inside
            {"command": "create", "path": "/tmp/evil.py", "file_text": "x"},
            {"command": "create", "path": "../evil.py", "file_text": "x"},
            {"command": "str_replace", "path": "/etc/hostname", "old_str": "a", "new_str": "b"},
        ]
        for arguments in cases:
            with pytest.raises(EditorError) as info:
                await editor(arguments)
            message = str(info.value)
            assert "outside the workspace /testbed" in message and arguments["path"] in message
        assert not await exists(sandbox, "/tmp/evil.py")
        assert not await exists(sandbox, "/evil.py")

        # Symlinks that lead out: the file link, a file under a directory link, and creating through one.
        for arguments in (
            {"command": "view", "path": "escape"},
            {"command": "str_replace", "path": "escape", "old_str": "a", "new_str": "b"},
            {"command": "insert", "path": f"{WORKDIR}/escape", "insert_line": 0, "new_str": "x"},
            {"command": "view", "path": "escape_dir/passwd"},
            {"command": "view", "path": "escape_dir"},
            {"command": "create", "path": "escape_dir/evil.conf", "file_text": "x"},
        ):
            with pytest.raises(EditorError) as info:
                await editor(arguments)
            message = str(info.value)
            assert "symbolic link" in message and "outside the workspace /testbed" in message
            assert arguments["path"] in message

        # Relative paths resolve against the workspace, not the shell's current directory.
        await sandbox.exec("cd pkg", 30)
        assert "def add" in await editor({"command": "view", "path": "main.py"})
        assert "VALUE" in await editor({"command": "view", "path": "pkg/mod.py"})
        assert WORKDIR in (await editor({"command": "view", "path": WORKDIR})).splitlines()[0]

    run(repo, body)


def test_missing_files(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        for arguments in (
            {"command": "view", "path": "nope.py"},
            {"command": "str_replace", "path": "nope.py", "old_str": "a"},
            {"command": "insert", "path": "nope.py", "insert_line": 0, "new_str": "a"},
        ):
            message = await error_of(editor, **arguments)
            assert "does not exist" in message and f"{WORKDIR}/nope.py" in message
        assert "directory" in await error_of(editor, command="str_replace", path="pkg", old_str="a")
        assert not await exists(sandbox, f"{WORKDIR}/nope.py")

    run(repo, body)


# -- non-UTF-8 -------------------------------------------------------------------------------------------------
def test_non_utf8_is_viewable_but_not_editable(repo: Path) -> None:
    async def body(editor: StrReplaceEditor, sandbox: Any) -> None:
        out = await editor({"command": "view", "path": "latin1.txt"})
        assert "not valid UTF-8" in out
        assert "     1\tcaf\N{REPLACEMENT CHARACTER} = 1" in out
        for arguments in (
            {"command": "str_replace", "path": "latin1.txt", "old_str": "= 1", "new_str": "= 3"},
            {"command": "insert", "path": "latin1.txt", "insert_line": 1, "new_str": "x = 0"},
        ):
            message = await error_of(editor, **arguments)
            assert "not valid UTF-8" in message and f"{WORKDIR}/latin1.txt" in message
        assert await cat(sandbox, f"{WORKDIR}/latin1.txt") == LATIN1
        assert "no edit" in await error_of(editor, command="undo_edit", path="latin1.txt")

    run(repo, body)
