"""The `str_replace_editor` tool: view, create and edit files of the task workspace.

The editor runs on the host and reaches files only through the sandbox's `exec` (and the read/write helpers built on
it), so it behaves the same on every backend. Every path is checked twice: lexically (no `..` or absolute path out of
the workspace) and after `realpath` inside the sandbox (no symbolic link out of it). Edits work on bytes: the region
that changes is spliced into the original bytes, so everything outside it (line endings, tabs, a missing trailing
newline) is kept exactly. Undo history lives in memory, one stack per resolved path. The schema the model sees is in
editor_schema.py, the pure path/text/argument helpers in editor_text.py, how results are shown (`cat -n` lines
clipped at a limit, the snippet after an edit) in editor_view.py.
"""

from __future__ import annotations

import posixpath
import shlex
from dataclasses import dataclass
from typing import Literal

from ..sandbox.base import ExecResult, Sandbox, write_file
from .editor_schema import COMMANDS, SCHEMA
from .editor_text import (EditorError, encode, find_all, inside, int_arg, line_end_offset, normalise, parse_view_range,
                          split_lines, string_arg)
from .editor_view import edit_report, render_lines

Kind = Literal["file", "dir", "other", "missing"]


@dataclass(frozen=True)
class _Target:
    shown: str  # the normalised absolute path the model asked for; used in messages
    real: str  # the same path with symlinks resolved in the sandbox; what is read, written and keyed in history
    kind: Kind


class StrReplaceEditor:
    SCHEMA: dict = SCHEMA

    def __init__(self, sandbox: Sandbox, *, max_view_chars: int = 16000, timeout: float = 60):
        self.sandbox = sandbox
        self.max_view_chars = max_view_chars
        self.timeout = timeout
        # Previous contents per resolved path, newest last; None marks a file that `create` made.
        self._history: dict[str, list[bytes | None]] = {}

    # -- entry point -----------------------------------------------------------------------------------------
    async def __call__(self, arguments: dict) -> str:
        if not isinstance(arguments, dict):
            raise EditorError(f"arguments must be an object with `command` and `path`; got {type(arguments).__name__}")
        command = arguments.get("command")
        if command is None:
            raise EditorError(f"Parameter `command` is required; valid commands: {', '.join(COMMANDS)}")
        if command not in COMMANDS:
            raise EditorError(f"Unknown command {command!r}; valid commands: {', '.join(COMMANDS)}")
        path = string_arg(arguments, "path", command, required=True)
        assert path is not None
        target = await self._resolve(path)
        handler = {
            "view": self._view,
            "create": self._create,
            "str_replace": self._str_replace,
            "insert": self._insert,
            "undo_edit": self._undo_edit,
        }[command]
        return await handler(target, arguments)

    # -- commands --------------------------------------------------------------------------------------------
    async def _view(self, target: _Target, arguments: dict) -> str:
        view_range = arguments.get("view_range")
        if target.kind == "dir":
            if view_range is not None:
                raise EditorError(f"view_range applies to files only; {target.shown} is a directory")
            return await self._view_dir(target)
        data, truncated = await self._read(target, editing=False)
        try:
            text = data.decode("utf-8")
            note = ""
        except UnicodeDecodeError as exc:
            text = data.decode("utf-8", errors="replace")
            note = (f"Note: {target.shown} is not valid UTF-8 (first bad byte at offset {exc.start}); "
                    "undecodable bytes are shown as \N{REPLACEMENT CHARACTER}.\n")
        if truncated:
            note += f"Note: only the first {len(data)} bytes could be read; {truncated} more bytes were not.\n"
        lines = split_lines(text)
        total = len(lines)
        if view_range is None:
            if total == 0:
                return f"{note}The file {target.shown} is empty."
            start, end = 1, total
        else:
            start, end = parse_view_range(view_range, total, target.shown)
        body = render_lines(lines, start, end, total, self.max_view_chars)
        return f"{note}Lines {start}-{end} of {total} in {target.shown}:\n{body}"

    async def _view_dir(self, target: _Target) -> str:
        # Hidden entries are pruned (not descended into), directories are marked with a trailing slash.
        quoted = shlex.quote(target.real)
        command = f"find {quoted} -mindepth 1 -maxdepth 2 -name '.*' -prune -o -type d -printf '%p/\\n' -o -print"
        result = await self._exec(command)
        if result.exit_code != 0 and not result.stdout:
            raise EditorError(f"could not list {target.shown}: {_stderr(result)}")
        entries = sorted(result.stdout.decode("utf-8", errors="replace").splitlines())
        if target.real != target.shown:  # show the names the model used, not the resolved ones
            entries = [target.shown + e[len(target.real):] for e in entries]
        header = f"Files and directories up to 2 levels deep in {target.shown}, excluding hidden items:\n"
        if not entries:
            return header + "(empty)"
        shown, used = [], 0
        for entry in entries:
            if shown and used + len(entry) + 1 > self.max_view_chars:
                break
            shown.append(entry)
            used += len(entry) + 1
        text = header + "\n".join(shown)
        if len(shown) < len(entries):
            text += (f"\n<listing clipped: {len(entries) - len(shown)} more entries not shown; "
                     "view a subdirectory to see them>")
        return text

    async def _create(self, target: _Target, arguments: dict) -> str:
        file_text = string_arg(arguments, "file_text", "create", required=True)
        assert file_text is not None
        if target.kind != "missing":
            what = "directory" if target.kind == "dir" else "file"
            raise EditorError(f"{target.shown} already exists (a {what}); create only makes new files. "
                              "Use str_replace or insert to change an existing file.")
        await self._write(target, encode(file_text, "file_text"))
        self._history.setdefault(target.real, []).append(None)
        return f"Created {target.shown} ({len(split_lines(file_text))} lines)."

    async def _str_replace(self, target: _Target, arguments: dict) -> str:
        old_str = string_arg(arguments, "old_str", "str_replace", required=True)
        new_str = string_arg(arguments, "new_str", "str_replace", required=False) or ""
        assert old_str is not None
        if old_str == "":
            raise EditorError("old_str is empty; it must be the exact text to replace. "
                              "To add text without replacing any, use the insert command.")
        data, text = await self._read_text(target)
        positions = find_all(text, old_str)
        if not positions:
            hint = ""
            if "\r\n" in text and "\r" not in old_str:
                hint = " The file has CRLF (\\r\\n) line endings, which old_str must match too."
            raise EditorError(f"No replacement was made: old_str was not found verbatim in {target.shown}. "
                              "It must match the file exactly, including whitespace and indentation (tabs vs "
                              f"spaces); view the file to copy the text exactly.{hint}")
        if len(positions) > 1:
            line_numbers = ", ".join(str(text.count("\n", 0, pos) + 1) for pos in positions)
            raise EditorError(f"No replacement was made: old_str occurs {len(positions)} times in {target.shown}, "
                              f"starting at lines {line_numbers}. Include more surrounding lines in old_str so "
                              "that it matches exactly one place.")
        pos = positions[0]
        # Splice at the byte level so the bytes before and after the match are untouched.
        byte_pos = len(text[:pos].encode("utf-8"))
        old_bytes = old_str.encode("utf-8")
        new_data = data[:byte_pos] + encode(new_str, "new_str") + data[byte_pos + len(old_bytes):]
        await self._write(target, new_data)
        self._history.setdefault(target.real, []).append(data)
        first = text.count("\n", 0, pos) + 1
        last = first + new_str.count("\n")
        return edit_report(target.shown, new_data, first, last, self.max_view_chars)

    async def _insert(self, target: _Target, arguments: dict) -> str:
        insert_line = int_arg(arguments, "insert_line", "insert")
        new_str = string_arg(arguments, "new_str", "insert", required=True)
        assert new_str is not None
        if new_str == "":
            raise EditorError("new_str is empty: there is nothing to insert.")
        data, text = await self._read_text(target)
        total = len(split_lines(text))
        if not 0 <= insert_line <= total:
            raise EditorError(f"insert_line {insert_line} is out of range: {target.shown} has {total} lines, so "
                              f"insert_line must be between 0 (top of the file) and {total} (after the last line).")
        if insert_line == total and data and not data.endswith(b"\n"):
            # After a last line that has no newline: end that line, keep new_str as given.
            offset, payload = len(data), b"\n" + encode(new_str, "new_str")
        else:
            offset = line_end_offset(data, insert_line)
            payload = encode(new_str if new_str.endswith("\n") else new_str + "\n", "new_str")
        new_data = data[:offset] + payload + data[offset:]
        await self._write(target, new_data)
        self._history.setdefault(target.real, []).append(data)
        inserted = len(split_lines(new_str))
        return edit_report(target.shown, new_data, insert_line + 1, insert_line + inserted, self.max_view_chars)

    async def _undo_edit(self, target: _Target, arguments: dict) -> str:
        stack = self._history.get(target.real)
        if not stack:
            raise EditorError(f"There is no edit of {target.shown} to undo (only create, str_replace and insert "
                              "made with this tool can be undone).")
        previous = stack.pop()
        if previous is None:
            result = await self._exec(f"rm -f -- {shlex.quote(target.real)}")
            if result.exit_code != 0:
                stack.append(previous)
                raise EditorError(f"could not remove {target.shown}: {_stderr(result)}")
            return f"Undid the creation of {target.shown}: the file was removed."
        try:
            await self._write(target, previous)
        except EditorError:
            stack.append(previous)
            raise
        text = previous.decode("utf-8", errors="replace")
        lines = split_lines(text)
        if not lines:
            return f"Undid the last edit of {target.shown}; it is empty again."
        body = render_lines(lines, 1, len(lines), len(lines), self.max_view_chars)
        return f"Undid the last edit of {target.shown}. Its content is now:\n{body}"

    # -- paths -----------------------------------------------------------------------------------------------
    async def _resolve(self, path: str) -> _Target:
        if not path.strip():
            raise EditorError("Parameter `path` is empty.")
        if "\0" in path or "\n" in path:
            raise EditorError(f"path {path!r} contains a NUL or newline character, which is not supported.")
        workdir = normalise(self.sandbox.workdir)
        shown = normalise(path if posixpath.isabs(path) else posixpath.join(workdir, path))
        if not inside(shown, workdir):
            raise EditorError(f"path {path!r} ({shown}) is outside the workspace {workdir}; "
                              f"only files under {workdir} can be viewed or edited.")
        # -m: the path (or its parents) may not exist yet, as for create. Resolving the workspace too covers a
        # backend whose workdir is itself a symlink.
        probe = (
            f"w=$(realpath -m -- {shlex.quote(workdir)}) && r=$(realpath -m -- {shlex.quote(shown)}) && "
            'printf "%s\\n%s\\n" "$w" "$r" && '
            'if [ -d "$r" ]; then echo dir; elif [ -f "$r" ]; then echo file; '
            'elif [ -e "$r" ] || [ -L "$r" ]; then echo other; else echo missing; fi'
        )
        result = await self._exec(probe)
        lines = result.stdout.decode("utf-8", errors="replace").splitlines()
        if result.exit_code != 0 or len(lines) != 3 or lines[2] not in ("file", "dir", "other", "missing"):
            raise EditorError(f"could not resolve {shown}: {_stderr(result) or 'realpath failed'}")
        real_workdir, real, kind = lines
        if not inside(real, real_workdir):
            raise EditorError(f"path {path!r} ({shown}) resolves through a symbolic link to {real}, which is "
                              f"outside the workspace {workdir}; it cannot be viewed or edited.")
        return _Target(shown=shown, real=real, kind=kind)  # type: ignore[arg-type]

    # -- sandbox I/O -----------------------------------------------------------------------------------------
    async def _exec(self, command: str) -> ExecResult:
        result = await self.sandbox.exec(command, self.timeout, merge_stderr=False)
        if result.timed_out:
            raise EditorError(f"the sandbox did not answer within {self.timeout:g} seconds; try again")
        return result

    async def _read(self, target: _Target, *, editing: bool) -> tuple[bytes, int]:
        """The file's bytes and how many bytes the backend dropped (always refused when editing)."""
        if target.kind == "missing":
            raise EditorError(f"{target.shown} does not exist. Check the path (view the directory to list it).")
        if target.kind == "dir":
            raise EditorError(f"{target.shown} is a directory, not a file.")
        if target.kind == "other":
            raise EditorError(f"{target.shown} is not a regular file (a device, socket or pipe); it cannot be read.")
        result = await self._exec(f"cat -- {shlex.quote(target.real)}")
        if result.exit_code != 0:
            raise EditorError(f"could not read {target.shown}: {_stderr(result)}")
        if editing and result.truncated_bytes:
            raise EditorError(f"{target.shown} is too large to edit with this tool; edit it with a shell command.")
        return result.stdout, result.truncated_bytes

    async def _read_text(self, target: _Target) -> tuple[bytes, str]:
        """Bytes and text of a file about to be edited; refuses undecodable files rather than corrupt them."""
        data, _ = await self._read(target, editing=True)
        try:
            return data, data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EditorError(f"{target.shown} is not valid UTF-8 text (first bad byte at offset {exc.start}); "
                              "this tool will not edit it because that could change its bytes. "
                              "Use a shell command to change it instead.") from None

    async def _write(self, target: _Target, data: bytes) -> None:
        try:
            await write_file(self.sandbox, target.real, data, self.timeout)
        except OSError as exc:
            raise EditorError(f"could not write {target.shown}: {exc}") from None


def _stderr(result: ExecResult) -> str:
    return (result.stderr or result.stdout).decode("utf-8", errors="replace").strip()[-500:]
