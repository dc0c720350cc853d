"""The local backend: a bubblewrap sandbox per rollout, network off, host filesystem read-only.

The task repository is mounted at `workdir` (default /testbed) copy-on-write: an overlayfs whose lower layer is a
git snapshot of the repo (shared, cached) and whose upper layer belongs to this sandbox. Debian's bubblewrap 0.8 has
no overlay option, so at start the overlay is mounted in a private mount namespace of its own (`unshare --mount`),
held open by a sleeping process that dies with its owner (PDEATHSIG), and each command enters that namespace
(`nsenter --mount`) before `exec bwrap`. The mount lives only in that namespace: nothing is ever mounted on the
host, and it goes when the holder goes. (Mounting per command instead cost about 4 ms of CPU a command.) Without
root (or where overlayfs cannot be mounted) the workspace is a plain copy instead.

Each command is a fresh bwrap process. The shell state the agent expects to persist (working directory and exported
variables) is saved by an EXIT trap into the sandbox's private state dir and restored before the next command, so a
killed command can never leave a wedged shell behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from ..config import LocalDeploymentConfig
from .base import ClosingContext, ExecResult, SandboxError, SandboxStartError
from .process_limit import ProcessLimit, reap_orphaned_cgroups

PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
BUNDLED_TASKS_DIR = Path(PACKAGE_DIR) / "tasks" / "bundled"
CAPTURE_LIMIT_BYTES = 4 * 1024 * 1024  # output beyond this is counted, not kept (a `yes` must not eat memory)
STATE_DIR_IN_SANDBOX = "/run/uni-agent"

RUNNER_SCRIPT = r"""
[ -f {state}/state.sh ] && source {state}/state.sh 2>/dev/null
__ua_save_state() {{
  local rc=$?
  {{ export -p; printf 'cd -- %q\n' "$PWD"; }} > {state}/state.sh.new 2>/dev/null && mv -f {state}/state.sh.new {state}/state.sh
  return $rc
}}
trap __ua_save_state EXIT
if [ "$UA_MERGE_STDERR" = 1 ]; then exec 2>&1; fi
unset UA_MERGE_STDERR
source {state}/cmd.sh
"""


def sandbox_root() -> Path:
    root = Path(os.environ.get("UNI_AGENT_SANDBOX_ROOT") or Path(tempfile.gettempdir()) / "uni-agent-sandboxes")
    root.mkdir(parents=True, exist_ok=True)
    return root


OWNER_FILE = "owner.pid"


def reap_orphaned_sandboxes(root: Path) -> list[Path]:
    """Remove sandbox dirs whose owning process is gone (a worker killed with -9 cannot clean up after itself).

    Its commands died with it (bwrap --die-with-parent, and the overlay mount lived only in their namespaces), so
    only the directory is left. Run at every sandbox start: another worker on this host may have died since the
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
MOUNT_HOLDER_NAME = "uni-agent-mounts"  # the holder's argv[0], then its sandbox dir: findable in /proc
_owners: dict[str, int] = {}  # sandbox dir → owner pid, as read from its owner file (it never changes)


def cache_root() -> Path:
    root = Path(os.environ.get("UNI_AGENT_CACHE_DIR") or Path.home() / ".cache" / "uni-agent")
    root.mkdir(parents=True, exist_ok=True)
    return root


def resolve_repo(repo: str) -> Path:
    """`bundled:<instance_id>` or a directory path → the directory holding the repository."""
    if repo.startswith("bundled:"):
        path = BUNDLED_TASKS_DIR / repo.removeprefix("bundled:") / "repo"
    else:
        path = Path(repo).expanduser()
    if not path.is_dir():
        raise SandboxStartError(f"task repository {repo!r} not found (looked at {path})")
    return path.resolve()


def _tree_fingerprint(path: Path) -> str:
    digest = hashlib.sha256(str(path).encode())
    for file in sorted(p for p in path.rglob("*") if ".git" not in p.relative_to(path).parts):
        stat = file.lstat()
        digest.update(f"{file.relative_to(path)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "uni-agent",
    "GIT_AUTHOR_EMAIL": "uni-agent@localhost",
    "GIT_COMMITTER_NAME": "uni-agent",
    "GIT_COMMITTER_EMAIL": "uni-agent@localhost",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


def prepare_base_repo(source: Path) -> Path:
    """A cached git snapshot of `source` (all files committed), shared read-only by every sandbox of the task.

    Built in a temp dir and renamed into place, so concurrent workers never see a half-built snapshot.
    """
    base = cache_root() / "repos" / f"{source.name}-{_tree_fingerprint(source)}"
    if base.is_dir():
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{base.name}-", dir=base.parent))
    try:
        shutil.copytree(source, building, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        env = {**os.environ, **GIT_IDENTITY}
        run = lambda *args: subprocess.run(["git", *args], cwd=building, env=env, check=True, capture_output=True)  # noqa: E731
        if not (building / ".git").exists():
            run("init", "-q", "-b", "main")
        run("add", "-A")
        run("commit", "-q", "--allow-empty", "--no-verify", "-m", "uni-agent base snapshot")
        try:
            os.rename(building, base)
        except OSError:  # another worker finished first; theirs is identical
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return base


def _python_dirs() -> list[str]:
    """Directories the sandbox needs read-only so that `python` (with pytest) works inside it."""
    dirs = {sys.prefix, sys.base_prefix, str(Path(sys.executable).resolve().parent.parent)}
    return sorted(d for d in dirs if not d.startswith("/usr/"))


class LocalSandbox(ClosingContext):
    def __init__(self, config: LocalDeploymentConfig, env_variables: dict[str, str] | None = None, name: str = ""):
        if config.repo is None:
            raise SandboxStartError("local deployment needs `repo` (a directory or bundled:<instance_id>)")
        self.config = config
        self.workdir = config.workdir
        self.env_variables = dict(env_variables or {})
        self.name = f"{name or 'sbx'}-{uuid.uuid4().hex[:8]}"
        self.dir: Path | None = None
        self.use_overlay = False
        self._mount_holder: asyncio.subprocess.Process | None = None
        self._bwrap_argv: dict[bool, list[str]] = {}
        self._base: Path | None = None
        self._running: set[asyncio.subprocess.Process] = set()
        self._lock = asyncio.Lock()
        self.process_limit = ProcessLimit(self.name, config.pids_limit)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if shutil.which("bwrap") is None:
            raise SandboxStartError("bubblewrap (bwrap) is not installed; apt-get install bubblewrap")
        self._base = await asyncio.to_thread(prepare_base_repo, resolve_repo(self.config.repo))
        root = sandbox_root()
        await asyncio.to_thread(reap_orphaned_sandboxes, root)
        self.dir = root / self.name
        for sub in ("upper", "work", "merged", "tmp", "home", "state"):
            (self.dir / sub).mkdir(parents=True)
        (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        self.process_limit.create()
        (self.dir / "state" / "run.sh").write_text(RUNNER_SCRIPT.format(state=STATE_DIR_IN_SANDBOX))
        (self.dir / "state" / "state.sh").write_text(self._initial_state())
        want_overlay = self.config.workspace == "overlay" or (self.config.workspace == "auto" and os.geteuid() == 0)
        self.use_overlay = want_overlay and await self._start_mount_holder()
        if not self.use_overlay:
            if self.config.workspace == "overlay":
                raise SandboxStartError("overlayfs workspace requested but it cannot be mounted here (needs root)")
            await asyncio.to_thread(shutil.copytree, self._base, self.dir / "merged", symlinks=True,
                                    dirs_exist_ok=True)
        probe = await self.exec("true", timeout=self.config.startup_timeout)
        if probe.exit_code != 0:
            raise SandboxStartError(f"sandbox did not start: {probe.output.strip()[-2000:]}")

    async def _start_mount_holder(self) -> bool:
        """Mount the overlay in a mount namespace of its own, held open by a sleeping process (see the module doc).
        False when overlayfs cannot be mounted here."""
        assert self.dir is not None
        hold = f'echo ready && exec -a "{MOUNT_HOLDER_NAME} $0" sleep infinity'
        holder = await asyncio.create_subprocess_exec(
            "setpriv", "--pdeathsig", "KILL", *self._overlay_prefix(), "bash", "-c", hold, str(self.dir),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        self._mount_holder = holder
        try:
            ready = await asyncio.wait_for(holder.stdout.readline(), self.config.startup_timeout)  # type: ignore[union-attr]
        except TimeoutError:
            ready = b""
        if ready == b"ready\n":
            return True
        await self._stop_mount_holder()
        return False

    async def _stop_mount_holder(self) -> None:
        holder, self._mount_holder = self._mount_holder, None
        if holder is not None:
            with contextlib.suppress(ProcessLookupError):
                holder.kill()
            await holder.wait()

    async def close(self) -> None:
        for proc in list(self._running):
            _kill_group(proc)
        await asyncio.to_thread(self.process_limit.remove)
        await self._stop_mount_holder()
        if self.dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.dir, True)
            self.dir = None

    # -- commands ----------------------------------------------------------------------------------------------
    def _initial_state(self) -> str:
        """The environment of the first command. Later commands inherit whatever the previous one left exported
        (so `unset` and `export` stick), starting from a clean slate: nothing of the host's environment leaks in."""
        env = {
            "PATH": f"{sys.prefix}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            **GIT_IDENTITY,
            **self.env_variables,
        }
        lines = [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
        return "\n".join(lines + [f"cd -- {shlex.quote(self.workdir)}", ""])

    def _overlay_prefix(self) -> list[str]:
        assert self.dir is not None and self._base is not None
        mount = 'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" && shift 4 && exec "$@"'
        d = self.dir
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh",
                str(self._base), str(d / "upper"), str(d / "work"), str(d / "merged")]

    def _bwrap_args(self, merge_stderr: bool) -> list[str]:
        """The bwrap command line, the same for every command of this sandbox (built once: it stats the host's
        layout, a millisecond of the event loop's time per command at hundreds of commands a second)."""
        if merge_stderr not in self._bwrap_argv:
            self._bwrap_argv[merge_stderr] = self._build_bwrap_args(merge_stderr)
        return self._bwrap_argv[merge_stderr]

    def _build_bwrap_args(self, merge_stderr: bool) -> list[str]:
        assert self.dir is not None
        d = self.dir
        env = {"UA_MERGE_STDERR": "1" if merge_stderr else "0"}  # the rest of the environment is shell state
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
                 "--bind", str(d / "state"), STATE_DIR_IN_SANDBOX]
        python_dirs = _python_dirs()
        for python_dir in python_dirs:
            args += ["--ro-bind", python_dir, python_dir]
        if any(PACKAGE_DIR.startswith(d + "/") for d in python_dirs):  # installed into the venv, not editable:
            args += ["--tmpfs", PACKAGE_DIR]  # its bundled tasks hold the tests and solutions the agent must not see
        args += ["--bind", str(d / "merged"), self.workdir, "--chdir", self.workdir]
        for key, value in env.items():
            args += ["--setenv", key, value]
        limits = [self.process_limit.shell_limit()]
        if self.config.max_memory_mb:
            limits.append(f"ulimit -v {self.config.max_memory_mb * 1024} 2>/dev/null;")
        args += ["bash", "--noprofile", "--norc", "-c", f"{' '.join(limits)} source {STATE_DIR_IN_SANDBOX}/run.sh"]
        return args

    async def exec(
        self, command: str, timeout: float, *, stdin: bytes | None = None, merge_stderr: bool = True
    ) -> ExecResult:
        if self.dir is None:
            raise SandboxError(f"sandbox {self.name} is not running")
        async with self._lock:  # one command at a time: they share the command file and the shell state
            return await self._exec(command, min(timeout, self.config.runtime_timeout), stdin, merge_stderr)

    async def _exec(self, command: str, timeout: float, stdin: bytes | None, merge_stderr: bool) -> ExecResult:
        assert self.dir is not None
        command_file = self.dir / "state" / "cmd.sh"
        try:
            # A new file, not the old one truncated: on ext4 rewriting a truncated file starts a writeback flush,
            # which blocked the event loop for milliseconds under load (a sixth of a busy worker's time).
            command_file.unlink(missing_ok=True)
            command_file.write_text(command + "\n")
        except FileNotFoundError:
            raise SandboxError(f"sandbox {self.name} is gone: {self.dir} was removed while in use") from None
        enter_mounts: list[str] = []
        if self.use_overlay:
            holder = self._mount_holder
            if holder is None or holder.returncode is not None:
                raise SandboxError(f"sandbox {self.name} is gone: its mount namespace holder has exited")
            enter_mounts = ["nsenter", f"--mount=/proc/{holder.pid}/ns/mnt", "--"]
        argv = self.process_limit.command_prefix() + enter_mounts + self._bwrap_args(merge_stderr)
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group, so a timeout kills everything it started
        )
        self._running.add(proc)
        # Feeding stdin, draining both outputs and waiting all happen together under the timeout: a command that
        # never reads its input, or writes a lot before reading, cannot stall us.
        io = asyncio.gather(_read_capped(proc.stdout), _read_capped(proc.stderr), _feed(proc, stdin), proc.wait())
        timed_out = False
        try:
            try:
                (stdout, dropped_out), (stderr, dropped_err), _, _ = await asyncio.wait_for(asyncio.shield(io),
                                                                                          timeout)
            except TimeoutError:
                timed_out = True
                _kill_group(proc)
                (stdout, dropped_out), (stderr, dropped_err), _, _ = await io
        except BaseException:
            _kill_group(proc)
            io.cancel()
            io.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no "never retrieved" noise
            with contextlib.suppress(BaseException):  # reap it now, while its event loop still runs
                await asyncio.shield(proc.wait())
            raise
        finally:
            self._running.discard(proc)
        return ExecResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=None if timed_out else proc.returncode,
            timed_out=timed_out,
            duration_s=time.monotonic() - started,
            truncated_bytes=dropped_out + dropped_err,
        )


async def _feed(proc: asyncio.subprocess.Process, data: bytes | None) -> None:
    if data is None or proc.stdin is None:
        return
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    proc.stdin.close()


async def _read_capped(stream: asyncio.StreamReader | None) -> tuple[bytes, int]:
    if stream is None:
        return b"", 0
    kept = bytearray()
    dropped = 0
    while chunk := await stream.read(65536):
        room = CAPTURE_LIMIT_BYTES - len(kept)
        kept += chunk[:room]
        dropped += max(0, len(chunk) - room)
    return bytes(kept), dropped


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
