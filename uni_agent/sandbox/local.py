"""The local backend: a bubblewrap sandbox per rollout, network off, host filesystem read-only.

One process chain per sandbox, started once: it joins the sandbox's pids cgroup, enters a private mount namespace
(`unshare --mount`) where the task repository is mounted at `workdir` copy-on-write (an overlayfs whose lower layer
is the shared git snapshot of the repo and whose upper layer belongs to this sandbox), and becomes `bwrap`, which
runs the sandbox supervisor (supervisor.py) in fresh namespaces. Every command is then a message to that supervisor
(session.py): no process chain per command, and what a command leaves running in the background lives as long as
the sandbox. Nothing is ever mounted on the host: the overlay exists only in the sandbox's namespace and goes with
it. Without root (or where overlayfs cannot be mounted) the workspace is a plain copy instead. Debian's bubblewrap
0.8 has no overlay option, hence the mount before bwrap.

The chain dies with its owner: `setpriv --pdeathsig KILL` (kept across the execs that follow) and bwrap's
`--die-with-parent`; the supervisor also exits when its stdin closes. Closing the sandbox ends the pid namespace,
and with it every process in the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path

from ..config import LocalDeploymentConfig
from .backend import SessionSandbox, Transport, process_transport
from .base import ExecResult, SandboxError, SandboxStartError
from .process_limit import ProcessLimit, reap_orphaned_cgroups
from .repo import BUNDLED_TASKS_DIR, PACKAGE_DIR, prepare_base_repo, resolve_repo
from .session import supervisor_argv
from .supervisor import CAPTURE_LIMIT_BYTES

__all__ = ["BUNDLED_TASKS_DIR", "CAPTURE_LIMIT_BYTES", "LocalSandbox", "reap_orphaned_sandboxes", "sandbox_root"]

STATE_DIR_ON_HOST = "state"  # the sandbox dir's subdirectory bound at the supervisor's state dir
CLOSE_GRACE_S = 1.0  # how long close() lets the supervisor exit by itself before killing the sandbox


def sandbox_root() -> Path:
    root = Path(os.environ.get("UNI_AGENT_SANDBOX_ROOT") or Path(tempfile.gettempdir()) / "uni-agent-sandboxes")
    root.mkdir(parents=True, exist_ok=True)
    return root


OWNER_FILE = "owner.pid"


def reap_orphaned_sandboxes(root: Path) -> list[Path]:
    """Remove sandbox dirs whose owning process is gone (a worker killed with -9 cannot clean up after itself).

    Its sandbox died with it (PDEATHSIG, bwrap --die-with-parent, and the overlay mount lived only in the
    sandbox's namespace), so only the directory is left. Run at every sandbox start: another worker on this host may have died since the
    last one. Kept cheap with a thousand sandboxes under the root (it was a read per dir per start, O(n^2) in all):
    each dir's owner is read once per process and remembered, liveness is checked once per distinct owner, and a reap
    that finds another one running in this process returns at once (that one is as recent)."""
    if not _reap_lock.acquire(blocking=False):
        return []
    try:
        removed = []
        prefix = os.path.join(root, "")  # plain strings: a Path per dir per start is what costs with 1000 dirs
        names = os.listdir(root)
        listed = {prefix + name for name in names}
        for gone in [key for key in _owners if key.startswith(prefix) and key not in listed]:
            del _owners[gone]
        alive: dict[int, bool] = {}
        for name in names:
            key = prefix + name
            owner = _owners.get(key)
            if owner is None:
                try:
                    with open(os.path.join(key, OWNER_FILE)) as f:
                        owner = _owners[key] = int(f.read())
                except (OSError, ValueError):
                    continue  # not ours, or still being created
            if owner not in alive:
                alive[owner] = os.path.exists(f"/proc/{owner}")
            if not alive[owner]:
                shutil.rmtree(key, ignore_errors=True)
                removed.append(root / name)
                _owners.pop(key, None)
        reap_orphaned_cgroups()  # machine-wide: also those of sandboxes under another root
        return removed
    finally:
        _reap_lock.release()


_reap_lock = threading.Lock()
_owners: dict[str, int] = {}  # sandbox dir → owner pid, as read from its owner file (it never changes)


def _python_dirs() -> list[str]:
    """Directories the sandbox needs read-only so that `python` (with pytest) works inside it."""
    dirs = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    return sorted(d for d in dirs if not d.startswith("/usr/"))


def _supervisor_python() -> str:
    """The system's python3 where there is one (always in the sandbox: /usr is), else the one running us."""
    return shutil.which("python3", path="/usr/bin:/bin") or sys.executable


class LocalSandbox(SessionSandbox):
    def __init__(self, config: LocalDeploymentConfig, env_variables: dict[str, str] | None = None, name: str = ""):
        if config.repo is None:
            raise SandboxStartError("local deployment needs `repo` (a directory or bundled:<instance_id>)")
        super().__init__(config, env_variables, f"{name or 'sbx'}-{uuid.uuid4().hex[:8]}")
        self.dir: Path | None = None
        self.use_overlay = False
        self._proc: asyncio.subprocess.Process | None = None
        self._base: Path | None = None
        self.process_limit = ProcessLimit(self.name, config.pids_limit)

    extra_env = {"GIT_CONFIG_GLOBAL": "/dev/null"}

    # -- where it lives ----------------------------------------------------------------------------------------
    async def _launch(self) -> Transport:
        if shutil.which("bwrap") is None:
            raise SandboxStartError("bubblewrap (bwrap) is not installed; apt-get install bubblewrap")
        self._base = await asyncio.to_thread(prepare_base_repo, resolve_repo(self.config.repo))
        root = sandbox_root()
        await asyncio.to_thread(reap_orphaned_sandboxes, root)
        self.dir = root / self.name
        for sub in ("upper", "work", "merged", "tmp", "home", STATE_DIR_ON_HOST):
            (self.dir / sub).mkdir(parents=True)
        (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        self.process_limit.create()
        self.use_overlay = await self._overlay_wanted()
        if not self.use_overlay:
            await asyncio.to_thread(shutil.copytree, self._base, self.dir / "merged", symlinks=True,
                                    dirs_exist_ok=True)
        self._proc = await self._spawn(self._argv(self.use_overlay))
        return process_transport(self._proc, "bwrap")

    async def _overlay_wanted(self) -> bool:
        wanted = self.config.workspace == "overlay" or (self.config.workspace == "auto" and os.geteuid() == 0)
        if not wanted:
            return False
        if not _overlay_works:  # probed until it first works, then known for the process
            if not await self._probe_overlay():
                if self.config.workspace == "overlay":
                    raise SandboxStartError("overlayfs workspace requested but it cannot be mounted here (needs root)")
                return False
            _overlay_works.append(True)
        return True

    async def _probe_overlay(self) -> bool:
        proc = await asyncio.create_subprocess_exec(
            *self._overlay_prefix(), "true", stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        return await proc.wait() == 0

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, limit=1 << 20)

    def _argv(self, overlay: bool) -> list[str]:
        # The cgroup is joined first, so the whole sandbox (bwrap, supervisor, commands) counts against pids.max.
        prefix = self.process_limit.command_prefix() + ["setpriv", "--pdeathsig", "KILL"]
        if overlay:
            prefix += self._overlay_prefix()
        return prefix + self._bwrap_args()

    async def _teardown(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            # The session closed the supervisor's stdin: it ends its commands and exits, and bwrap with it. Waited
            # for a moment (so the CPU it used is accounted to this process), then killed: bwrap's pid namespace
            # goes with it, every process of the sandbox.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), CLOSE_GRACE_S)
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
            await proc.wait()
        await asyncio.to_thread(self.process_limit.remove)
        if self.dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.dir, True)
            self.dir = None

    async def exec(self, command: str, timeout: float, *, stdin: bytes | None = None,
                   merge_stderr: bool = True) -> ExecResult:
        if self.dir is not None and not os.path.isdir(self.dir):  # a stat: cheap next to the command
            raise SandboxError(f"sandbox {self.name} is gone: {self.dir} was removed while in use")
        return await super().exec(command, timeout, stdin=stdin, merge_stderr=merge_stderr)

    def _overlay_prefix(self) -> list[str]:
        assert self.dir is not None and self._base is not None
        mount = 'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" && shift 4 && exec "$@"'
        d = self.dir
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh",
                str(self._base), str(d / "upper"), str(d / "work"), str(d / "merged")]

    def _bwrap_args(self) -> list[str]:
        assert self.dir is not None
        d = self.dir
        args = ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--clearenv"]
        if self.config.network:
            args.append("--share-net")
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for link in ("bin", "lib", "lib32", "lib64", "sbin"):
            target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
            if target:
                args += ["--symlink", target, f"/{link}"]
            elif os.path.isdir(f"/{link}"):
                args += ["--ro-bind", f"/{link}", f"/{link}"]
        args += ["--proc", "/proc", "--dev", "/dev",
                 "--bind", str(d / "tmp"), "/tmp", "--bind", str(d / "home"), "/root",
                 "--bind", str(d / STATE_DIR_ON_HOST), self.state_dir]
        python_dirs = _python_dirs()
        for python_dir in python_dirs:
            args += ["--ro-bind", python_dir, python_dir]
        if any(PACKAGE_DIR.startswith(d + "/") for d in python_dirs):  # installed into the venv, not editable:
            args += ["--tmpfs", PACKAGE_DIR]  # its bundled tasks hold the tests and solutions the agent must not see
        args += ["--bind", str(d / "merged"), self.workdir, "--chdir", self.workdir]
        for key, value in self._base_env().items():
            args += ["--setenv", key, value]
        # Limits set here bind the supervisor and so every command (a shell's `ulimit` is inherited).
        limits = [self.process_limit.shell_limit()]
        if self.config.max_memory_mb:
            limits.append(f"ulimit -v {self.config.max_memory_mb * 1024} 2>/dev/null;")
        args += ["bash", "--noprofile", "--norc", "-c", f'{" ".join(limits)} exec "$@"', "limits",
                 *supervisor_argv(_supervisor_python(), self.state_dir)]
        return args

    def _base_env(self) -> dict[str, str]:
        """The sandbox's environment before `env_variables`: a clean slate, nothing of the host's leaks in."""
        return {
            "PATH": f"{sys.prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
        }


_overlay_works: list[bool] = []  # [True] once an overlay was mounted in this process


