"""What a task's Dockerfile tells us without building it: the workdir, the ENV, the files COPY'd in, and whether the
host can stand in for the image (the local bubblewrap backend).

The host can stand in when the Dockerfile only sets metadata (FROM, ARG, ENV, WORKDIR, LABEL, ...) and COPYs files
from the build context into the workdir: the local sandbox then starts from those files at the workdir, with the
host's own tools (bash, coreutils, python3) in place of the base image's. A RUN, an ADD, a multi-stage build or a COPY
outside the workdir needs the real image: such a task runs on the container backend only.

Here-documents are read as BuildKit's Dockerfile frontend reads them (dockerfile:1.4+, buildah 1.33+): on a RUN,
COPY or ADD line (not the JSON form), each word `<<NAME`, `<<-NAME`, `<<'NAME'`, `<<"NAME"` (an optional fd number
in front) opens a heredoc whose body is the raw lines that follow, up to a line that is exactly NAME (`<<-`: leading
tabs stripped, from the terminator and the body). The body lines are not instructions, comments or continuations.
`COPY <<EOF /path` makes a file from the body (variables expanded unless the name was quoted); a RUN heredoc is a
script for the shell, so such a task needs the real image like any RUN.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError

# Instructions that only change image metadata: harmless when the host stands in for the image.
METADATA_ONLY = {"FROM", "ARG", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "SHELL", "STOPSIGNAL", "HEALTHCHECK",
                 "VOLUME", "MAINTAINER", "USER", "ONBUILD"}
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


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]  # relative to the build context (environment/)
    dest: str  # absolute path in the image
    line: int
    inline: tuple[Heredoc, ...] = ()  # heredoc sources: files made from the Dockerfile's own text


@dataclass
class DockerfileInfo:
    workdir: str | None = None
    """The last WORKDIR (relative ones resolved), where the agent's commands and the tests run."""
    env: dict[str, str] = field(default_factory=dict)
    copies: list[Copy] = field(default_factory=list)
    host_blockers: list[str] = field(default_factory=list)
    """Why the host cannot stand in for the image (empty: it can)."""

    @property
    def host_compatible(self) -> bool:
        return not self.host_blockers


def _raw_words(line: str) -> list[str]:
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


def _heredoc_marker(word: str) -> tuple[str, bool, bool] | None:
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


def _logical_lines(text: str, path: Path | None = None) -> list[Instruction]:
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
            for word in _raw_words(instruction):
                marker = _heredoc_marker(word)
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


def _substitute(value: str, variables: dict[str, str]) -> str:
    return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(3), m.group(2) or ""), value)


def _clipped(text: str, limit: int = 60) -> str:
    """An instruction shortened for a message, with an ellipsis where it was cut (a reader must not take the cut
    for the whole line)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _copy_args(rest: str) -> tuple[list[str], list[str]]:
    """(flags, paths) of a COPY/ADD: the JSON form or whitespace-separated words."""
    words: list[str]
    if rest.lstrip().startswith("["):
        try:
            words = [str(w) for w in json.loads(rest)]
        except json.JSONDecodeError:
            words = shlex.split(rest)
    else:
        words = shlex.split(rest)
    flags = [w for w in words if w.startswith("--")]
    return flags, [w for w in words if not w.startswith("--")]


def _copy(keyword: str, rest: str, heredocs: tuple[Heredoc, ...], variables: dict[str, str], workdir: str,
          line: int, path: Path) -> Copy | None:
    """A COPY (or an ADD of heredocs only); None for COPY --from, which needs another image."""
    names = {doc.name: doc for doc in heredocs}
    words = _raw_words(rest) if heredocs else []
    inline: list[Heredoc] = []
    if heredocs:  # take the heredoc words out before the usual argument parsing (it would unquote them)
        kept = []
        for word in words:
            marker = _heredoc_marker(word)
            if marker is None:
                kept.append(word)
                continue
            doc = names[marker[0]]
            inline.append(Heredoc(doc.name, _substitute(doc.content, variables) if doc.expand else doc.content,
                                  doc.expand))
        if words and _heredoc_marker(words[-1]) is not None:
            raise ConfigError(f"{path}:{line}: {keyword} cannot take a heredoc as its destination")
        rest = " ".join(kept)
    flags, paths = _copy_args(_substitute(rest, variables))
    if any(f.startswith("--from") for f in flags):
        return None
    if len(paths) + len(inline) < 2:
        raise ConfigError(f"{path}:{line}: {keyword} needs a source and a destination")
    dest = paths[-1]
    absolute = posixpath.join(workdir, dest)
    # A trailing slash (or several sources) means "into this directory"; normpath would drop it.
    return Copy(tuple(paths[:-1]), posixpath.normpath(absolute) + ("/" if dest.endswith("/") else ""), line,
                tuple(inline))


def _env_pairs(rest: str, line: int, path: Path) -> list[tuple[str, str]]:
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


def parse_dockerfile(path: Path) -> DockerfileInfo:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no Dockerfile (environment/Dockerfile describes the task's machine)") from None
    info = DockerfileInfo()
    variables: dict[str, str] = {}
    workdir = "/"
    stages = 0
    for item in _logical_lines(text, path):
        line, instruction, heredocs = item.line, item.text, item.heredocs
        keyword, _, rest = instruction.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            stages += 1
            if stages == 2:
                info.host_blockers.append(f"line {line}: a multi-stage build")
        elif keyword == "ARG":
            name, sep, default = rest.partition("=")
            variables.setdefault(name.strip(), default.strip().strip('"') if sep else "")
        elif keyword == "ENV":
            for key, value in _env_pairs(_substitute(rest, variables), line, path):
                variables[key] = info.env[key] = value
        elif keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, _substitute(rest, variables).strip('"')))
            info.workdir = workdir
        elif keyword == "COPY" or (keyword == "ADD" and heredocs):
            copy = _copy(keyword, rest, heredocs, variables, workdir, line, path)
            if copy is None:
                info.host_blockers.append(f"line {line}: COPY --from another image or stage")
            elif keyword == "ADD" and copy.sources:  # ADD of files/URLs (unpacks archives): needs the image
                info.host_blockers.append(f"line {line}: ADD {_clipped(rest)}")
            else:
                info.copies.append(copy)
        elif keyword in ("RUN", "ADD"):
            info.host_blockers.append(f"line {line}: {keyword} {_clipped(rest)}")
        elif keyword not in METADATA_ONLY:
            raise ConfigError(f"{path}:{line}: unknown Dockerfile instruction {keyword!r}")
    if info.workdir is None:
        raise ConfigError(f"{path}: no WORKDIR (the task's working directory, where the agent and the tests run)")
    for copy in info.copies:
        dest = copy.dest.rstrip("/") or "/"
        if dest != info.workdir and not dest.startswith(info.workdir.rstrip("/") + "/"):
            info.host_blockers.append(f"line {copy.line}: COPY to {copy.dest}, outside the workdir {info.workdir}")
    return info


def _sources(context: Path, pattern: str, line: int) -> list[Path]:
    relative = posixpath.normpath(pattern.lstrip("/"))
    if relative.startswith(".."):
        raise ConfigError(f"Dockerfile line {line}: COPY source {pattern!r} is outside the build context")
    if any(ch in relative for ch in "*?["):
        found = sorted(p for p in context.glob(relative) if fnmatch.fnmatch(p.relative_to(context).as_posix(),
                                                                            relative))
    else:
        found = [context / relative] if (context / relative).exists() else []
    if not found:
        raise ConfigError(f"Dockerfile line {line}: COPY source {pattern!r} not found in {context}")
    return found


def materialize_workspace(info: DockerfileInfo, context: Path, dest: Path) -> None:
    """Lay out at `dest` what the image would hold at the workdir: every COPY, with Docker's rules (a directory's
    contents are copied; a file goes into a destination ending in '/' or given several sources)."""
    if not info.host_compatible:
        raise ConfigError(f"{context}: the host cannot stand in for this image: {'; '.join(info.host_blockers)}")
    assert info.workdir is not None
    dest.mkdir(parents=True, exist_ok=True)
    for copy in info.copies:
        target = dest / posixpath.relpath(copy.dest.rstrip("/") or "/", info.workdir)
        into_dir = copy.dest.endswith("/") or len(copy.sources) + len(copy.inline) > 1
        for doc in copy.inline:  # a heredoc becomes a file named after its terminator, or the destination itself
            file_target = target / doc.name if into_dir or target.is_dir() else target
            file_target.parent.mkdir(parents=True, exist_ok=True)
            file_target.write_text(doc.content)
            file_target.chmod(0o644)
        for pattern in copy.sources:
            for source in _sources(context, pattern, copy.line):
                if source.is_dir():
                    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
                else:
                    file_target = target / source.name if into_dir or target.is_dir() else target
                    file_target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, file_target)


# ---- heredocs for builders that predate them ----

HEREDOC_DIR = ".uni-agent-heredoc"  # in the build context: the heredoc bodies as files
HEREDOC_RUN_DIR = "/tmp/uni-agent-heredoc"  # in the image: a RUN heredoc's script


def has_heredocs(path: Path) -> bool:
    return any(item.heredocs for item in _logical_lines(path.read_text(), path))


def classic_dockerfile(path: Path, build_args: dict[str, str] | None = None) -> tuple[str, dict[str, tuple[str, int]]]:
    """The Dockerfile with every heredoc turned into a file of the build context, for builders without heredoc
    support (buildah before 1.33, e.g. Debian 12's podman 4.3, reads the body lines as instructions). Returns the new
    text and {context-relative path: (content, mode)}. Same effect as BuildKit's:

    - `COPY/ADD <<NAME dest`: the body (tabs stripped for `<<-`, ARG/ENV expanded unless the name was quoted) as the
      file NAME, copied like any file (`ADD` of heredocs only becomes `COPY`);
    - `RUN <<NAME` alone: the body is the script, run by the shell (SHELL), or executed itself when it starts with
      `#!`; any other heredoc RUN: the command line with its heredoc bodies and terminators, run by the shell.
      The script is COPY'd to /tmp/uni-agent-heredoc/ first (it stays there in the image)."""
    text = path.read_text()
    raw_lines = text.splitlines(keepends=True)
    out: list[str] = []
    files: dict[str, tuple[str, int]] = {}
    variables: dict[str, str] = {}
    build_args = build_args or {}
    position = 0
    for item in _logical_lines(text, path):
        out.extend(raw_lines[position:item.line - 1])  # comments and blank lines between instructions
        position = item.end
        keyword, _, rest = item.text.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG":
            name, sep, default = rest.partition("=")
            variables[name.strip()] = build_args.get(name.strip(), default.strip().strip('"') if sep else "")
        elif keyword == "ENV":
            variables.update(_env_pairs(_substitute(rest, variables), item.line, path))
        if not item.heredocs or keyword not in HEREDOC_INSTRUCTIONS:
            out.extend(raw_lines[item.line - 1:item.end])
            continue
        tag = f"{HEREDOC_DIR}/line-{item.line}"
        if keyword == "RUN":
            out.extend(_classic_run(rest, item, tag, files))
        else:
            out.append(_classic_copy(keyword, rest, item, tag, files, variables))
    out.extend(raw_lines[position:])
    return "".join(out), files


def _leading_flags(rest: str) -> tuple[list[str], str]:
    """(the `--flag` words at the start of an instruction's arguments, the raw text after them)."""
    flags = []
    for word in _raw_words(rest):
        if not word.startswith("--"):
            break
        flags.append(word)
        rest = rest.lstrip()[len(word):]
    return flags, rest.lstrip()


def _classic_run(rest: str, item: Instruction, tag: str, files: dict[str, tuple[str, int]]) -> list[str]:
    flags, command = _leading_flags(rest)  # RUN --mount=... / --network=...: kept for the builder to judge
    image_path = f"{HEREDOC_RUN_DIR}/line-{item.line}"
    run = " ".join(["RUN", *flags])
    words = _raw_words(command)
    if len(words) == 1 and _heredoc_marker(words[0]) is not None:  # `RUN <<EOF`: the body is the script
        body = item.heredocs[0].content
        if body.startswith("#!"):  # executed itself, by its interpreter
            files[f"{tag}/run"] = (body, 0o755)
            return [f"COPY {tag}/run {image_path}\n", f"{run} {image_path}\n"]
        script = body
    else:  # the command with its heredocs, for the shell to read
        script = command + "".join(f"\n{doc.raw}{doc.name}" for doc in item.heredocs) + "\n"
    files[f"{tag}/run"] = (script, 0o644)
    return [f"COPY {tag}/run {image_path}\n", f"{run} . {image_path}\n"]


def _classic_copy(keyword: str, rest: str, item: Instruction, tag: str, files: dict[str, tuple[str, int]],
                  variables: dict[str, str]) -> str:
    docs = {doc.name: doc for doc in item.heredocs}
    flags, rest = _leading_flags(rest)
    paths, from_files = [], False
    for word in _raw_words(rest):
        marker = _heredoc_marker(word)
        if marker is None:
            paths.append(shlex.split(word)[0] if shlex.split(word) else word)
            continue
        doc = docs[marker[0]]
        files[f"{tag}/{doc.name}"] = (_substitute(doc.content, variables) if doc.expand else doc.content, 0o644)
        paths.append(f"{tag}/{doc.name}")
    from_files = any(not p.startswith(f"{tag}/") for p in paths[:-1])
    name = keyword if from_files else "COPY"  # an ADD of heredocs only is a plain COPY
    return f"{' '.join([name, *flags])} {json.dumps(paths)}\n"


def prepare_build_context(context: Path, scratch: Path, build_args: dict[str, str] | None = None
                          ) -> tuple[Path, Path]:
    """(build context, Dockerfile) for a builder without heredoc support: the task's own when its Dockerfile has
    no heredoc; else a copy of the context under `scratch` with the heredoc files and the classic Dockerfile."""
    dockerfile = context / "Dockerfile"
    if not has_heredocs(dockerfile):
        return context, dockerfile
    text, files = classic_dockerfile(dockerfile, build_args)
    copy = scratch / "context"
    shutil.copytree(context, copy, symlinks=True)
    for relative, (content, mode) in files.items():
        target = copy / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(mode)
    (copy / "Dockerfile.classic").write_text(text)
    return copy, copy / "Dockerfile.classic"
