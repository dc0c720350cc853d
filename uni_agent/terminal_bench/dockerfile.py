"""What a task's Dockerfile tells us without building it: the workdir, the ENV, the files COPY'd in, and whether the
host can stand in for the image (the local bubblewrap backend).

The host can stand in when the Dockerfile only sets metadata (FROM, ARG, ENV, WORKDIR, LABEL, ...) and COPYs files
from the build context into the workdir: the local sandbox then starts from those files at the workdir, with the
host's own tools (bash, coreutils, python3) in place of the base image's. A RUN, an ADD, a multi-stage build or a COPY
outside the workdir needs the real image: such a task runs on the container backend only.

Here-documents (read in dockerfile_lines.py, as BuildKit reads them): `COPY <<EOF /path` makes a file from the
body (variables expanded unless the name was quoted); a RUN heredoc is a script for the shell, so such a task needs
the real image like any RUN. Builders without heredoc support get a rewritten Dockerfile: classic_dockerfile.py.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..config import ConfigError
from .dockerfile_lines import Heredoc, env_pairs, heredoc_marker, logical_lines, raw_words, substitute

# Instructions that only change image metadata: harmless when the host stands in for the image.
METADATA_ONLY = {"FROM", "ARG", "LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "SHELL", "STOPSIGNAL", "HEALTHCHECK",
                 "VOLUME", "MAINTAINER", "USER", "ONBUILD"}


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
    words = raw_words(rest) if heredocs else []
    inline: list[Heredoc] = []
    if heredocs:  # take the heredoc words out before the usual argument parsing (it would unquote them)
        kept = []
        for word in words:
            marker = heredoc_marker(word)
            if marker is None:
                kept.append(word)
                continue
            doc = names[marker[0]]
            inline.append(Heredoc(doc.name, substitute(doc.content, variables) if doc.expand else doc.content,
                                  doc.expand))
        if words and heredoc_marker(words[-1]) is not None:
            raise ConfigError(f"{path}:{line}: {keyword} cannot take a heredoc as its destination")
        rest = " ".join(kept)
    flags, paths = _copy_args(substitute(rest, variables))
    if any(f.startswith("--from") for f in flags):
        return None
    if len(paths) + len(inline) < 2:
        raise ConfigError(f"{path}:{line}: {keyword} needs a source and a destination")
    dest = paths[-1]
    absolute = posixpath.join(workdir, dest)
    # A trailing slash (or several sources) means "into this directory"; normpath would drop it.
    return Copy(tuple(paths[:-1]), posixpath.normpath(absolute) + ("/" if dest.endswith("/") else ""), line,
                tuple(inline))


def parse_dockerfile(path: Path) -> DockerfileInfo:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no Dockerfile (environment/Dockerfile describes the task's machine)") from None
    info = DockerfileInfo()
    variables: dict[str, str] = {}
    workdir = "/"
    stages = 0
    for item in logical_lines(text, path):
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
            for key, value in env_pairs(substitute(rest, variables), line, path):
                variables[key] = info.env[key] = value
        elif keyword == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, substitute(rest, variables).strip('"')))
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


