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
import tempfile
import threading
import uuid
from pathlib import Path

from ..config import LocalDeploymentConfig
from .backend import SessionSandbox, Transport, process_transport
from .base import ExecResult, SandboxError, SandboxStartError
from .bwrap import Mounts, bwrap_argv
from .image_store import ImageLease, ImageStore
from .process_limit import ProcessLimit, reap_orphaned_cgroups
from .repo import BUNDLED_TASKS_DIR, prepare_base_repo, resolve_repo
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
    last one. Kept cheap with a thousand sandboxes under the root (a read per dir per start would be O(n^2) in all):
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


def image_store() -> ImageStore:
    """This process's view of the node's image cache (UNI_AGENT_IMAGE_CACHE), made on first use."""
    root = os.environ.get("UNI_AGENT_IMAGE_CACHE", "")
    if root not in _image_stores:
        _image_stores[root] = ImageStore(root or None)
    return _image_stores[root]


_image_stores: dict[str, ImageStore] = {}


class LocalSandbox(SessionSandbox):
    def __init__(self, config: LocalDeploymentConfig, env_variables: dict[str, str] | None = None, name: str = ""):
        if config.repo is None and config.image is None:  # the YAML may leave both to the rows; a row must not
            raise SandboxStartError("local deployment needs `repo` (a directory or bundled:<instance_id>), `image`, "
                                    "or both")
        super().__init__(config, env_variables, f"{name or 'sbx'}-{uuid.uuid4().hex[:8]}")
        self.dir: Path | None = None
        self.use_overlay = False
        self._proc: asyncio.subprocess.Process | None = None
        self._base: Path | None = None  # the shared snapshot of the task repo, when there is one
        self._lease: ImageLease | None = None  # the unpacked image, when the sandbox runs one
        self.process_limit = ProcessLimit(self.name, config.pids_limit)

    extra_env = {"GIT_CONFIG_GLOBAL": "/dev/null"}

    # -- where it lives ----------------------------------------------------------------------------------------
    async def _launch(self) -> Transport:
        if shutil.which("bwrap") is None:
            raise SandboxStartError("bubblewrap (bwrap) is not installed; apt-get install bubblewrap")
        if self.config.image:
            self._lease = await asyncio.to_thread(image_store().open, self.config.image)
            if "workdir" not in self.config.model_fields_set and self._lease.image.workdir:
                self.workdir = self._lease.image.workdir  # the image's WorkingDir, unless the row names one
        if self.config.repo:
            self._base = await asyncio.to_thread(prepare_base_repo, resolve_repo(self.config.repo))
        root = sandbox_root()
        await asyncio.to_thread(reap_orphaned_sandboxes, root)
        self.dir = root / self.name
        image_dirs = ("root-upper", "root-work", "root") if self._lease is not None else ()
        for sub in ("upper", "work", "merged", "tmp", "home", STATE_DIR_ON_HOST, *image_dirs):
            (self.dir / sub).mkdir(parents=True)
        (self.dir / OWNER_FILE).write_text(str(os.getpid()))
        self.process_limit.create()
        self.use_overlay = await self._overlay_wanted()
        if not self.use_overlay:
            await asyncio.to_thread(self._copy_workspace)
        if self._lease is not None and self._lease.image.uid != 0:  # what the image's User must be able to write
            for sub in (STATE_DIR_ON_HOST, "upper", "merged"):
                os.chown(self.dir / sub, self._lease.image.uid, self._lease.image.gid)
        self._proc = await self._spawn(self._argv(self.use_overlay))
        return process_transport(self._proc, "bwrap")

    def _copy_workspace(self) -> None:
        """Without overlayfs: full copies (slow for an image: give the worker root, or `workspace: overlay`)."""
        assert self.dir is not None
        for lower, _, _, target in self._layers():
            shutil.copytree(lower, target, symlinks=True, dirs_exist_ok=True)

    def _layers(self) -> list[tuple[Path, Path, Path, Path]]:
        """(shared read-only lower dir, this sandbox's upper and work dirs, mount point) per copy-on-write tree."""
        assert self.dir is not None
        d, layers = self.dir, []
        if self._lease is not None:
            layers.append((self._lease.image.rootfs, d / "root-upper", d / "root-work", d / "root"))
        if self._base is not None:
            layers.append((self._base, d / "upper", d / "work", d / "merged"))
        return layers

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
        if self._lease is not None:
            self._lease.release()
            self._lease = None
        if self.dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.dir, True)
            self.dir = None

    async def exec(self, command: str, timeout: float, *, stdin: bytes | None = None,
                   merge_stderr: bool = True) -> ExecResult:
        if self.dir is not None and not os.path.isdir(self.dir):  # a stat: cheap next to the command
            raise SandboxError(f"sandbox {self.name} is gone: {self.dir} was removed while in use")
        return await super().exec(command, timeout, stdin=stdin, merge_stderr=merge_stderr)

    def _overlay_prefix(self) -> list[str]:
        """A private mount namespace with each copy-on-write tree mounted, then the rest of the argv."""
        mount = ('while [ "$1" != -- ]; do mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3" "$4" '
                 '|| exit 1; shift 4; done; shift; exec "$@"')
        trees = [str(path) for layer in self._layers() for path in layer]
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", mount, "sh", *trees, "--"]

    def _bwrap_args(self) -> list[str]:
        assert self.dir is not None
        d = self.dir
        image = self._lease.image if self._lease is not None else None
        mounts = Mounts(root=d / "root" if image else None, repo=d / "merged" if self._base else None,
                        tmp=d / "tmp", home=d / "home", state=d / STATE_DIR_ON_HOST)
        # Limits set here bind the supervisor and so every command (a shell's `ulimit` is inherited).
        limits = [self.process_limit.shell_limit()]
        if self.config.max_memory_mb:
            limits.append(f"ulimit -v {self.config.max_memory_mb * 1024} 2>/dev/null;")
        return bwrap_argv(mounts, self.workdir, self.state_dir, image, network=self.config.network,
                          shell_limits=" ".join(limits))


_overlay_works: list[bool] = []  # [True] once an overlay was mounted in this process


