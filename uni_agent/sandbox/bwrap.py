"""The bubblewrap command line of a local sandbox: what it sees as `/`, where the task repo is, its environment.

Two kinds of root:
- the host's: `/usr` and `/etc` read-only, the Python running uni-agent (for pytest), the task repo at `workdir`;
- an image's (image_store.py): its unpacked root filesystem, copy-on-write, as `/`; nothing of the host is visible.
  Its Env applies, then ours; its User through the supervisor (which keeps only the capabilities to switch to it).
Either way: every namespace unshared (network only if asked), all capabilities dropped, a clean environment, and the
sandbox supervisor as the one process bwrap starts.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .image_store import ImageRootfs
from .repo import PACKAGE_DIR
from .supervisor_launch import compiled_supervisor, supervisor_argv, supervisor_file_argv, supervisor_shell_argv

# In the sandbox's state dir: its own copy, so no sandbox can touch another's. Its name says what the process is.
SUPERVISOR_PYC = "uni-agent-sandbox-supervisor.pyc"
IMAGE_DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Mounts:
    """Host directories of one sandbox (under its sandbox dir)."""

    root: Path | None  # the image's root, mounted copy-on-write (None: the host's root)
    repo: Path | None  # the task repo, mounted copy-on-write, bound at workdir (None: the image's own workdir)
    tmp: Path
    home: Path
    state: Path  # the supervisor's state dir


def bwrap_argv(mounts: Mounts, workdir: str, state_dir: str, image: ImageRootfs | None, *, network: bool,
               shell_limits: str, read_only: dict[str, str] | None = None) -> list[str]:
    switch_user = image is not None and image.uid != 0
    # Every namespace but, for an image's User, the user namespace: bwrap's maps only our own uid, so switching to
    # another one inside it would fail. Capabilities are dropped either way.
    unshare = ["--unshare-all"] if not switch_user else [
        "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    args = ["bwrap", *unshare, "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
    if network:
        args.append("--share-net")
    if image is None:
        args += _host_root(mounts)
        env = host_env()
        supervisor = _host_supervisor(mounts.state, state_dir)
    else:
        args += ["--bind", str(mounts.root), "/", "--proc", "/proc", "--dev", "/dev"]
        env = _image_env(image)
        if switch_user:
            args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
            env["UNI_AGENT_RUN_AS"] = f"{image.uid}:{image.gid}"  # the supervisor takes it out of its environment
        supervisor = supervisor_shell_argv(state_dir)  # the image may lack python3: say so plainly
    args += ["--bind", str(mounts.state), state_dir]
    for inside, host in (read_only or {}).items():  # {path inside: host dir}, e.g. a harness's environment
        args += ["--ro-bind", host, inside]
    if mounts.repo is not None:
        args += ["--bind", str(mounts.repo), workdir, "--chdir", workdir]
    for key, value in env.items():
        args += ["--setenv", key, value]
    if not shell_limits:  # a pids cgroup and no memory cap: no shell in between (bash costs ~2 ms CPU a start)
        return args + supervisor
    return args + ["bash", "--noprofile", "--norc", "-c", f'{shell_limits} exec "$@"', "limits", *supervisor]


def _host_root(mounts: Mounts) -> list[str]:
    return host_root_args(["--bind", str(mounts.tmp), "/tmp", "--bind", str(mounts.home), "/root"])


def host_root_args(own_dirs: list[str]) -> list[str]:
    """The host's root as every sandbox over it sees it (the fork server's too, fork_server.py): /usr, /etc and the
    Python running uni-agent read-only, a fresh /proc and /dev, and `own_dirs` (the sandbox's /tmp and HOME) before the
    Python's dirs, so that a venv under /tmp or /root stays visible."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("bin", "lib", "lib32", "lib64", "sbin"):
        target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
        if target:
            args += ["--symlink", target, f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            args += ["--ro-bind", f"/{link}", f"/{link}"]
    args += ["--proc", "/proc", "--dev", "/dev", *own_dirs]
    python_dirs = _python_dirs()
    for python_dir in python_dirs:
        args += ["--ro-bind", python_dir, python_dir]
    if any(PACKAGE_DIR.startswith(d + "/") for d in python_dirs):  # installed into the venv, not editable:
        args += ["--tmpfs", PACKAGE_DIR]  # its bundled tasks hold the tests and solutions the agent must not see
    return args


def python_dirs_under_own_dirs() -> list[str]:
    """The Python's dirs that a sandbox's own /tmp or /root would hide (a venv there): the fork server binds them
    again."""
    return [d for d in _python_dirs() if d.startswith(("/tmp/", "/root/")) or d in ("/tmp", "/root")]


def _python_dirs() -> list[str]:
    """Directories the sandbox needs read-only so that `python` (with pytest) works inside it."""
    dirs = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    return sorted(d for d in dirs if d != "/usr" and not d.startswith("/usr/"))  # /usr is bound already


def _host_supervisor(state_on_host: Path, state_dir: str) -> list[str]:
    """The supervisor's command line in a sandbox over the host's root: from a .pyc put in its state dir where the
    host's python3 is the interpreter running us, else from source."""
    python = _supervisor_python()
    compiled = compiled_supervisor(python)
    if compiled is None:
        return supervisor_argv(python, state_dir)
    (state_on_host / SUPERVISOR_PYC).write_bytes(compiled)
    return supervisor_file_argv(python, f"{state_dir}/{SUPERVISOR_PYC}", state_dir)


def _supervisor_python() -> str:
    """The system's python3 where there is one (always in the sandbox: /usr is), else the one running us."""
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def _common_env() -> dict[str, str]:
    return {"TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1"}


def host_env() -> dict[str, str]:
    """The sandbox's environment before `env_variables`: a clean slate, nothing of the host's leaks in."""
    return {"PATH": f"{sys.prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8", **_common_env()}


def _image_env(image: ImageRootfs) -> dict[str, str]:
    """As a container runtime would start it: the image's Env (with a default PATH and the user's HOME)."""
    return {"PATH": IMAGE_DEFAULT_PATH, "HOME": image.home, **_common_env(), **image.env_dict()}
