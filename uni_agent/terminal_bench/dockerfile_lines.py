"""Reading a Dockerfile into instructions: continuation lines joined, comments dropped, here-documents taken out of
the text, ARG/ENV references substituted. What the instructions mean is dockerfile.py's (the host standing in for
the image) and classic_dockerfile.py's (heredocs for builders that predate them).

Here-documents are read as BuildKit's Dockerfile frontend reads them (dockerfile:1.4+, buildah 1.33+): on a RUN,
COPY or ADD line (not the JSON form), each word `<<NAME`, `<<-NAME`, `<<'NAME'`, `<<"NAME"` (an optional fd number
in front) opens a heredoc whose body is the raw lines that follow, up to a line that is exactly NAME (`<<-`: leading
tabs stripped, from the terminator and the body). The body lines are not instructions, comments or continuations.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError

_VAR = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|([A-Za-z_][A-Za-z0-9_]*))")
# BuildKit's heredoc word: optional fd, `<<`, optional `-` (strip tabs), the (possibly quoted) terminator.
_HEREDOC_WORD = re.compile(r"^(\d*)<<(-?)\s*([^<]*)$")
HEREDOC_INSTRUCTIONS = {"RUN", "COPY", "ADD"}


@dataclass(frozen=True)
class Heredoc:
    name: str  # the terminator, unquoted; also the file name of a COPY heredoc
    raw: str  # the body as written, each line with its newline
    expand: bool  # unquoted terminator: ARG/ENV references in a COPY body are expanded
    chomp: bool = False  # `<<-`: leading tabs are stripped from the body

    @property
    def content(self) -> str:
        """The body as a COPY file or a lone RUN script gets it (BuildKit strips the tabs of `<<-` itself; a RUN
        whose heredocs feed a command gets `raw`, and the shell strips them)."""
        return re.sub(r"(?m)^\t+", "", self.raw) if self.chomp else self.raw


@dataclass(frozen=True)
class Instruction:
    line: int  # first line (1-based)
    end: int  # last line, heredoc bodies included
    text: str  # continuation lines joined, comments dropped
    heredocs: tuple[Heredoc, ...] = ()


def raw_words(line: str) -> list[str]:
    """Whitespace-separated words with their quotes and escapes kept, as BuildKit's lexer splits a line when it
    looks for heredocs (RawQuotes, RawEscapes); like it, `<<` keeps the blanks after it (`<< EOF` is one word)."""
    words, word, quote, in_word, i = [], "", "", False, 0
    while i < len(line):
        ch = line[i]
        i += 1
        if ch == "\\" and quote != "'" and i < len(line):
            word, in_word, i = word + ch + line[i], True, i + 1
        elif quote:
            word += ch
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            word, quote, in_word = word + ch, ch, True
        elif ch == "<" and line[i:i + 1] == "<":
            word, in_word, i = word + "<<", True, i + 1
            if line[i:i + 1] == "-" and line[i + 1:i + 2] in (" ", "\t"):  # `<<- EOF` (ParseHeredoc takes it)
                word, i = word + "-", i + 1
            while i < len(line) and line[i] in " \t":
                word, i = word + line[i], i + 1
        elif ch.isspace():
            if in_word:
                words.append(word)
            word, in_word = "", False
        else:
            word, in_word = word + ch, True
    if in_word:
        words.append(word)
    return words


def heredoc_marker(word: str) -> tuple[str, bool, bool] | None:
    """(name, chomp, expand) when `word` opens a heredoc, else None."""
    match = _HEREDOC_WORD.match(word)
    if not match or not match.group(3):
        return None
    rest = match.group(3)
    try:
        unquoted = shlex.split(rest)
    except ValueError:
        return None
    if len(unquoted) != 1:  # the terminator must be one word
        return None
    name = unquoted[0]
    quoted = (rest.count("'") + rest.count('"')) != (name.count("'") + name.count('"'))
    return name, match.group(2) == "-", not quoted


def _can_hold_heredoc(instruction: str) -> bool:
    keyword, _, rest = instruction.partition(" ")
    keyword, rest = keyword.upper(), rest.strip()
    if keyword == "ONBUILD":
        keyword, _, rest = rest.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
    if keyword not in HEREDOC_INSTRUCTIONS:
        return False
    if rest.startswith("["):  # the JSON (exec) form takes no heredocs
        try:
            return not isinstance(json.loads(rest), list)
        except json.JSONDecodeError:
            return True
    return True


def logical_lines(text: str, path: Path | None = None) -> list[Instruction]:
    """The instructions, continuations joined and comments dropped; heredoc bodies are consumed here, so their lines
    are never read as instructions."""
    lines: list[Instruction] = []
    raw_lines = text.splitlines()
    pending, start, index = "", 0, 0
    while index < len(raw_lines):
        number, raw = index + 1, raw_lines[index]
        index += 1
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continuation are skipped, as Docker does
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        instruction, pending = pending + stripped, ""
        heredocs: list[Heredoc] = []
        if "<<" in instruction and _can_hold_heredoc(instruction):
            for word in raw_words(instruction):
                marker = heredoc_marker(word)
                if marker is None:
                    continue
                name, chomp, expand = marker
                body: list[str] = []
                while True:
                    if index >= len(raw_lines):
                        raise ConfigError(f"{path or 'Dockerfile'}:{start}: unterminated heredoc <<{name} "
                                          f"(no line {name!r} before the end of the file)")
                    line = raw_lines[index].rstrip("\r")
                    index += 1
                    if (line.lstrip("\t") if chomp else line) == name:
                        break
                    body.append(line + "\n")
                heredocs.append(Heredoc(name, "".join(body), expand, chomp))
        lines.append(Instruction(start, index, instruction, tuple(heredocs)))
    if pending.strip():
        lines.append(Instruction(start, len(raw_lines), pending.strip()))
    return lines


def substitute(value: str, variables: dict[str, str]) -> str:
    return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(3), m.group(2) or ""), value)


def env_pairs(rest: str, line: int, path: Path) -> list[tuple[str, str]]:
    words = shlex.split(rest)
    if words and "=" not in words[0]:  # the legacy `ENV KEY value with spaces` form
        return [(words[0], rest.split(None, 1)[1] if len(words) > 1 else "")]
    pairs = []
    for word in words:
        key, sep, value = word.partition("=")
        if not sep:
            raise ConfigError(f"{path}:{line}: ENV {rest!r}: expected KEY=VALUE pairs")
        pairs.append((key, value))
    return pairs


