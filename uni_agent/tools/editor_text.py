"""The editor's pure parts: paths, lines and byte offsets, and reading a request's arguments. A bad request raises
EditorError, whose text is the observation the model reads."""

from __future__ import annotations

import json
import posixpath
from typing import Any


class EditorError(Exception):
    """A bad request; str(e) is the observation shown to the model."""


def normalise(path: str) -> str:
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/") if norm.startswith("//") else norm  # POSIX keeps a leading '//'; we do not


def inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def split_lines(text: str) -> list[str]:
    """Lines split on \\n only (a \\r stays part of its line); a final newline does not start an extra line."""
    if not text:
        return []
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return lines


def find_all(text: str, needle: str) -> list[int]:
    # Overlapping matches count too: "aa" in "aaa" is ambiguous, not unique.
    positions, pos = [], text.find(needle)
    while pos != -1:
        positions.append(pos)
        pos = text.find(needle, pos + 1)
    return positions


def line_end_offset(data: bytes, line: int) -> int:
    """Byte offset just after the newline ending `line` (1-based); 0 for line 0."""
    offset = 0
    for _ in range(line):
        offset = data.index(b"\n", offset) + 1
    return offset


def encode(text: str, name: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate from a JSON "\ud800" escape
        raise EditorError(f"{name} contains characters that cannot be encoded as UTF-8 (lone surrogates).") from None




def string_arg(arguments: dict, name: str, command: str, *, required: bool) -> str | None:
    value = arguments.get(name)
    if value is None:
        if required:
            raise EditorError(f"Parameter `{name}` is required for command `{command}`.")
        return None
    if not isinstance(value, str):
        raise EditorError(f"Parameter `{name}` must be a string; got {type(value).__name__}.")
    return value


def int_arg(arguments: dict, name: str, command: str) -> int:
    value = arguments.get(name)
    if value is None:
        raise EditorError(f"Parameter `{name}` is required for command `{command}`.")
    # Models sometimes send numbers as strings; accept those that are plainly integers.
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, int):
        raise EditorError(f"Parameter `{name}` must be an integer; got {value!r}.")
    return value


def parse_view_range(value: Any, total: int, shown: str) -> tuple[int, int]:
    if isinstance(value, str):  # a JSON list sent as a string
        try:
            value = json.loads(value)
        except ValueError:
            pass
    if (not isinstance(value, (list, tuple)) or len(value) != 2
            or any(isinstance(v, bool) or not isinstance(v, int) for v in value)):
        raise EditorError(f"view_range must be a list of two integers [start, end], e.g. [10, 40]; got {value!r}.")
    start, end = value
    if total == 0:
        raise EditorError(f"{shown} is empty; view it without view_range.")
    if not 1 <= start <= total:
        raise EditorError(f"view_range start {start} is out of range: {shown} has {total} lines, so start must be "
                          f"between 1 and {total}.")
    if end == -1:
        return start, total
    if end < start:
        raise EditorError(f"view_range end {end} is before start {start}; use -1 as end to read to the end.")
    if end > total:
        raise EditorError(f"view_range end {end} is past the end: {shown} has {total} lines. "
                          "Use an end of at most that, or -1 to read to the end.")
    return start, end
