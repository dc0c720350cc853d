"""How a sandbox's supervisor (supervisor.py) is started: the command lines that run its source, or its compiled
code, inside a sandbox. The source travels on the command line, so no file needs to be in the sandbox first."""

from __future__ import annotations

import functools
import importlib.util
import marshal
import os
import sys
from pathlib import Path

SUPERVISOR_SOURCE = (Path(__file__).with_name("supervisor.py")).read_text()
STATE_DIR_IN_SANDBOX = "/run/uni-agent"
NO_PYTHON = "the sandbox image has no python3: the uni-agent sandbox supervisor needs python3 (>= 3.6) in the image"


def supervisor_argv(python: str = "python3", state_dir: str = STATE_DIR_IN_SANDBOX, lifetime_s: float = 0) -> list[str]:
    """The command line that starts the supervisor inside a sandbox (no file needs to be there first). With a
    lifetime, the supervisor ends the sandbox by itself after that many seconds (its owner may have crashed)."""
    return [python, "-I", "-S", "-c", SUPERVISOR_SOURCE, state_dir, f"{lifetime_s:g}"]


def supervisor_file_argv(python: str, path: str, state_dir: str = STATE_DIR_IN_SANDBOX,
                         lifetime_s: float = 0) -> list[str]:
    """The same, from the compiled supervisor at `path` inside the sandbox (compiled_supervisor's bytes)."""
    return [python, "-I", "-S", path, state_dir, f"{lifetime_s:g}"]


@functools.cache
def compiled_supervisor(python: str) -> bytes | None:
    """The supervisor as a .pyc that `python` runs, when `python` is the interpreter running us (the same bytecode);
    else None. Run from it, a sandbox's supervisor skips compiling its ~28 KB of source: 7 ms a start."""
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return None
    code = compile(SUPERVISOR_SOURCE, "uni-agent-supervisor", "exec")
    # The header of a .pyc (PEP 552): magic, flags 0 (timestamp-based), then mtime and size, which nothing checks
    # when the file is run directly.
    return importlib.util.MAGIC_NUMBER + bytes(12) + marshal.dumps(code)


def supervisor_shell_argv(state_dir: str = STATE_DIR_IN_SANDBOX, lifetime_s: float = 0) -> list[str]:
    """The same, through /bin/sh, for images where python3 may be missing: the failure then says so plainly."""
    script = (f'command -v python3 >/dev/null 2>&1 || {{ echo "{NO_PYTHON}" >&2; exit 127; }}; '
              'exec python3 -I -S -c "$0" "$@"')
    return ["/bin/sh", "-c", script, SUPERVISOR_SOURCE, state_dir, f"{lifetime_s:g}"]
