"""The bubblewrap sandbox a build step runs in, and the `conda activate` stand-in of every environment.

A build step sees the machine as a task's sandbox will (the host's /usr and /etc, the repository at /testbed, the
environment at /opt/miniconda3, the interpreter at its own path) plus the network and the builder's way to the index
(index_access.py), so that what pip writes (scripts' first lines, the venv's config, an editable install's path)
names the paths of the task's sandbox. A step that must
not change the environment (a row's own install) gets it as an overlay whose writes are thrown away; the overlay is
mounted as the local backend mounts its workspaces (root, or a user namespace of one's own).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..sandbox.bwrap import host_root_args
from ..sandbox.overlay import DURABLE_SETUP_SCRIPT
from ..sandbox.userns import user_namespace
from .index_access import index_access_args
from .interpreters import Interpreter
from .plan import CONDA_ROOT

BUILD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PIP_CACHE_INSIDE = "/root/.cache/pip"

# /opt/miniconda3/bin/activate of every environment: the eval scripts of the official images run
# `source /opt/miniconda3/bin/activate` and `conda activate testbed`; this puts the venv first on PATH, as conda would.
ACTIVATE_SHIM = """\
# uni-agent: stands in for miniconda's activate script (uni_agent/envs/isolation.py). `conda activate NAME` puts
# /opt/miniconda3/envs/NAME/bin first on PATH; no other conda command exists here.
conda() {
    if [ "${1:-}" = activate ] && [ -d "/opt/miniconda3/envs/${2:-}" ]; then
        export PATH="/opt/miniconda3/envs/$2/bin:$PATH" CONDA_PREFIX="/opt/miniconda3/envs/$2" \\
            CONDA_DEFAULT_ENV="$2" VIRTUAL_ENV="/opt/miniconda3/envs/$2"
        return 0
    fi
    if [ "${1:-}" = activate ]; then
        echo "conda: no environment '${2:-}' under /opt/miniconda3/envs (uni-agent envs build makes testbed)" >&2
    else
        echo "conda: only 'conda activate NAME' works here (a uni-agent environment, not miniconda)" >&2
    fi
    return 1
}
"""
# HOME's git config in a build sandbox: setuptools_scm and friends run git in /testbed, owned by the builder.
GITCONFIG = "[safe]\n\tdirectory = *\n[user]\n\tname = uni-agent\n\temail = uni-agent@localhost\n"


def write_shim(conda_root: Path) -> None:
    (conda_root / "bin").mkdir(parents=True, exist_ok=True)
    (conda_root / "bin" / "activate").write_text(ACTIVATE_SHIM)
    (conda_root / "envs").mkdir(exist_ok=True)


@dataclass(frozen=True)
class StepDirs:
    """Host directories of one build step."""

    repo: Path  # at /testbed, writable
    conda_root: Path  # at /opt/miniconda3: writable, or the lower layer of a throwaway overlay (scratch/overlay)
    scratch: Path  # the step's own /tmp, HOME and overlay dirs
    pip_cache: Path  # shared by every step: pip's wheel cache


CONSTRAINTS_INSIDE = "/tmp/uni-agent-constraints.txt"


def step_argv(dirs: StepDirs, interpreter: Interpreter, interpreter_dir: str, script: str, *,
              throwaway_env: bool, constraints: str = "") -> list[str]:
    """The command that runs `script` (bash) in a build sandbox. `interpreter_dir`: the host directory mounted at
    the interpreter's own prefix. `throwaway_env`: the environment is an overlay; what the step writes to it is gone
    with the step."""
    tmp, home = dirs.scratch / "tmp", dirs.scratch / "home"
    for path in (tmp, home, dirs.pip_cache):
        path.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text(GITCONFIG)
    pip_settings = {}
    if constraints:  # every pip of the step, build isolation's included, reads PIP_CONSTRAINT
        (tmp / Path(CONSTRAINTS_INSIDE).name).write_text(constraints)
        pip_settings["PIP_CONSTRAINT"] = CONSTRAINTS_INSIDE
    conda_root = dirs.conda_root
    prefix: list[str] = []
    if throwaway_env:
        layers = [dirs.scratch / name for name in ("env-upper", "env-work", "env-merged")]
        for path in layers:
            path.mkdir(exist_ok=True)
        namespace = user_namespace()
        prefix = namespace.argv(mount=True) if namespace is not None else [
            "unshare", "--mount", "--propagation", "private", "--"]
        prefix += ["sh", "-c", DURABLE_SETUP_SCRIPT, "sh", "", "--", str(conda_root), *map(str, layers), "--"]
        conda_root = layers[2]
    bwrap = ["bwrap", "--unshare-all", "--share-net", "--die-with-parent", "--clearenv",
             *host_root_args(["--bind", str(tmp), "/tmp", "--bind", str(home), "/root"])]
    if interpreter.needs_mount:
        bwrap += ["--ro-bind", interpreter_dir, interpreter.prefix]
    bwrap += ["--bind", str(conda_root), CONDA_ROOT, "--bind", str(dirs.repo), "/testbed",
              "--bind", str(dirs.pip_cache), PIP_CACHE_INSIDE, "--chdir", "/testbed"]
    index_args, index_settings = index_access_args(dirs.scratch)
    bwrap += index_args
    for key, value in {**index_settings, **pip_settings, "PATH": BUILD_PATH, "HOME": "/root", "LANG": "C.UTF-8",
                       "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1", "USER": "root"}.items():
        bwrap += ["--setenv", key, value]
    return prefix + bwrap + ["bash", "--noprofile", "--norc", "-c", script]


def overlay_possible() -> bool:
    """Whether a throwaway overlay can be mounted here: as root, or in a user namespace of one's own."""
    return os.geteuid() == 0 or user_namespace() is not None
