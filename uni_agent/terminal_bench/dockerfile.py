"""What a task's Dockerfile tells us without building it: the workdir, the ENV, the files COPY'd in, and whether the
host can stand in for the image (the local bubblewrap backend).

The host can stand in when the Dockerfile only sets metadata (FROM, ARG, ENV, WORKDIR, LABEL, ...) and COPYs files
from the build context into the workdir: the local sandbox then starts from those files at the workdir, with the
host's own tools (bash, coreutils, python3) in place of the base image's. A RUN, an ADD, a multi-stage build or a COPY
outside the workdir needs the real image: such a task runs on the container backend only.
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


@dataclass(frozen=True)
class Copy:
    sources: tuple[str, ...]  # relative to the build context (environment/)
    dest: str  # absolute path in the image
    line: int


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


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, instruction) with continuations joined and comments dropped."""
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
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
        lines.append((start, pending + stripped))
        pending = ""
    if pending.strip():
        lines.append((start, pending.strip()))
    return lines


def _substitute(value: str, variables: dict[str, str]) -> str:
    return _VAR.sub(lambda m: variables.get(m.group(1) or m.group(3), m.group(2) or ""), value)


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
    for line, instruction in _logical_lines(text):
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
        elif keyword == "COPY":
            flags, paths = _copy_args(_substitute(rest, variables))
            if any(f.startswith("--from") for f in flags):
                info.host_blockers.append(f"line {line}: COPY --from another image or stage")
                continue
            if len(paths) < 2:
                raise ConfigError(f"{path}:{line}: COPY needs a source and a destination")
            dest = paths[-1]
            absolute = posixpath.join(workdir, dest)
            # A trailing slash (or several sources) means "into this directory"; normpath would drop it.
            info.copies.append(Copy(tuple(paths[:-1]), posixpath.normpath(absolute) + ("/" if dest.endswith("/")
                                                                                        else ""), line))
        elif keyword in ("RUN", "ADD"):
            info.host_blockers.append(f"line {line}: {keyword} {rest[:60]}")
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
        into_dir = copy.dest.endswith("/") or len(copy.sources) > 1
        for pattern in copy.sources:
            for source in _sources(context, pattern, copy.line):
                if source.is_dir():
                    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)
                else:
                    file_target = target / source.name if into_dir or target.is_dir() else target
                    file_target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, file_target)
