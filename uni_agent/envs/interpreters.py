"""Where a Python X.Y for an environment comes from: uv's managed Pythons, pyenv's, conda's, then PATH.

An environment is a copy of one of these installations (build.make_prefix). Inside a sandbox the interpreter is also
mounted at the path it has here (`Interpreter.prefix`): pyenv's and conda's builds load their libpython from there by
absolute path. A system Python (prefix /usr) is skipped: it is not an installation of its own that can be copied.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..config import ConfigError

PROBE_TIMEOUT_S = 30
PROBE = "import sys; print(sys.version.split()[0]); print(sys.base_prefix); print(sys.executable)"


@dataclass(frozen=True)
class Interpreter:
    executable: str  # resolved path of the python binary
    version: str  # e.g. 3.9.18
    prefix: str  # its installation (sys.base_prefix): what a sandbox must see at the same path
    source: str  # uv, pyenv, conda or PATH

    @property
    def needs_mount(self) -> bool:
        return not (self.prefix == "/usr" or self.prefix.startswith("/usr/"))


def find_python(version: str) -> Interpreter:
    """The first Python `version` (X.Y) of uv, pyenv, conda and PATH; ConfigError names the version and how to
    get it when none has it."""
    for source, candidates in (("uv", _uv(version)), ("pyenv", _pyenv(version)), ("conda", _conda(version)),
                               ("PATH", _path(version))):
        for candidate in candidates:
            found = _probe(candidate, source)
            # A system Python (under /usr) is not an installation of its own to copy into an environment
            if found is not None and _minor(found.version) == version and found.needs_mount:
                return found
    raise ConfigError(
        f"no Python {version} found (looked in uv's managed Pythons, pyenv's versions, conda's environments and "
        f"PATH for python{version}, system Pythons under /usr left out); install one, e.g. "
        f"`uv python install {version}` or `pyenv install {version}`, then run `uni-agent envs build` again")


def _minor(full: str) -> str:
    return ".".join(full.split(".")[:2])


def _probe(executable: str, source: str) -> Interpreter | None:
    try:
        done = subprocess.run([executable, "-c", PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or len(lines) != 3:  # a path with spaces is not one we can mount plainly either
        return None
    return Interpreter(str(Path(lines[2]).resolve()), lines[0], lines[1], source)


def _uv(version: str) -> list[str]:
    uv = shutil.which("uv")
    if uv is None:
        return []
    done = subprocess.run([uv, "python", "find", "--no-project", version], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S)
    return [done.stdout.strip()] if done.returncode == 0 and done.stdout.strip() else []


def _pyenv(version: str) -> list[str]:
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    found = glob.glob(f"{root}/versions/{version}.*/bin/python{version}")
    return sorted(found, key=_version_order, reverse=True)  # the newest patch release first


def _version_order(path: str) -> tuple[int, ...]:
    name = Path(path).parent.parent.name
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("."))


def _conda(version: str) -> list[str]:
    roots = [os.environ.get("CONDA_PREFIX", ""), os.environ.get("CONDA_EXE", "").rsplit("/bin/", 1)[0]]
    found = []
    for root in filter(None, roots):
        found += glob.glob(f"{root}/envs/*/bin/python{version}") + glob.glob(f"{root}/bin/python{version}")
    return found


def _path(version: str) -> list[str]:
    found = shutil.which(f"python{version}")
    return [found] if found else []
