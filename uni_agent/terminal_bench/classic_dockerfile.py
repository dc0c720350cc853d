"""Heredocs for builders that predate them: a Dockerfile rewritten with every heredoc turned into a file of the build
context (buildah before 1.33, e.g. Debian 12's podman 4.3, reads heredoc body lines as instructions)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from .dockerfile_lines import (HEREDOC_INSTRUCTIONS, Instruction, env_pairs, heredoc_marker, logical_lines, raw_words,
                               substitute)

HEREDOC_DIR = ".uni-agent-heredoc"  # in the build context: the heredoc bodies as files
HEREDOC_RUN_DIR = "/tmp/uni-agent-heredoc"  # in the image: a RUN heredoc's script


def has_heredocs(path: Path) -> bool:
    return any(item.heredocs for item in logical_lines(path.read_text(), path))


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
    for item in logical_lines(text, path):
        out.extend(raw_lines[position:item.line - 1])  # comments and blank lines between instructions
        position = item.end
        keyword, _, rest = item.text.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "ARG":
            name, sep, default = rest.partition("=")
            variables[name.strip()] = build_args.get(name.strip(), default.strip().strip('"') if sep else "")
        elif keyword == "ENV":
            variables.update(env_pairs(substitute(rest, variables), item.line, path))
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
    for word in raw_words(rest):
        if not word.startswith("--"):
            break
        flags.append(word)
        rest = rest.lstrip()[len(word):]
    return flags, rest.lstrip()


def _classic_run(rest: str, item: Instruction, tag: str, files: dict[str, tuple[str, int]]) -> list[str]:
    flags, command = _leading_flags(rest)  # RUN --mount=... / --network=...: kept for the builder to judge
    image_path = f"{HEREDOC_RUN_DIR}/line-{item.line}"
    run = " ".join(["RUN", *flags])
    words = raw_words(command)
    if len(words) == 1 and heredoc_marker(words[0]) is not None:  # `RUN <<EOF`: the body is the script
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
    for word in raw_words(rest):
        marker = heredoc_marker(word)
        if marker is None:
            paths.append(shlex.split(word)[0] if shlex.split(word) else word)
            continue
        doc = docs[marker[0]]
        files[f"{tag}/{doc.name}"] = (substitute(doc.content, variables) if doc.expand else doc.content, 0o644)
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
