"""The local backend: a bubblewrap sandbox per rollout, network off, host filesystem read-only.

One process chain per sandbox, started once: it joins the sandbox's pids cgroup, enters a private mount namespace
(`unshare --mount`) where the task repository is mounted at `workdir` copy-on-write (an overlayfs whose lower layer
is the shared git snapshot of the repo and whose upper layer belongs to this sandbox), and becomes `bwrap`, which
runs the sandbox supervisor (supervisor.py) in fresh namespaces. Every command is then a message to that supervisor
(session.py): no process chain per command, and what a command leaves running in the background lives as long as
the sandbox. Nothing is ever mounted on the host: the overlay exists only in the sandbox's namespace and goes with
it. Debian's bubblewrap 0.8 has no overlay option, hence the mount before bwrap. Without root the chain first
enters a user namespace of its own (userns.py), where the caller is root: the overlay is mounted there, and bwrap
acts as it does for real root (an image's owners and User included, where the user has subordinate ids). Only
where no overlay can be mounted at all is the workspace a plain copy (said once per process, in the log).

The chain dies with its owner: `setpriv --pdeathsig KILL` (kept across the execs that follow) and bwrap's
`--die-with-parent`; the supervisor also exits when its stdin closes. Closing the sandbox ends the pid namespace,
and with it every process in the sandbox.

Most sandboxes do not need a chain of their own: one over the host's root with an overlay workspace, no network and
no extra mounts is forked by the worker's fork server (fork_server.py, `launcher: auto`), the same namespaces and mounts
for a tenth of the CPU. The chain above serves the rest (images, network, a harness's mounts) and any machine where no
fork server works.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import uuid
from pathlib import Path
from typing import Literal

from pydantic import Field

from .backend import SessionSandbox, Transport, pipe_transport, process_transport
from .base import DeploymentBase, ExecResult, SandboxError, SandboxStartError
from .bwrap import Mounts, bwrap_argv, host_env
from .command_gate import DEFAULT_HOLD_S, DEFAULT_SLOTS, command_gate
from .fork_server import (ForkServer, ForkServerClosed, ForkServerKey, fork_server_failure, fork_server_for,
                          fork_server_stderr, running_fork_server)
from .image_store import ImageLease, ImageRootfs, ImageStore
from .leftovers import OWNER_FILE, reap_due, reap_orphaned_sandboxes, remove_in_removal_thread, to_thread_kept
from .overlay import SETUP_SCRIPT, overlay_wanted
from .private_dir import make_private_subdir, sandbox_root
from .process_limit import ProcessLimit, pids_cgroup_parent
from .repo import BUNDLED_TASKS_DIR, REPOS_DIR, cache_root, prepare_base_repo, resolve_repo
from .supervisor import CAPTURE_LIMIT_BYTES
from .userns import NO_SUBORDINATE_IDS, UserNamespace, user_namespace

__all__ = ["BUNDLED_TASKS_DIR", "CAPTURE_LIMIT_BYTES", "LocalDeploymentConfig", "LocalSandbox",
           "reap_orphaned_sandboxes", "sandbox_root", "warm_fork_server"]

STATE_DIR_ON_HOST = "state"  # the sandbox dir's subdirectory bound at a bwrap's supervisor's state dir (the fork
# server's sandboxes keep theirs on their own tmpfs root: fork_server_main.py)
CLOSE_GRACE_S = 1.0  # how long close() lets the supervisor exit by itself before killing the sandbox
FORK_SERVER_KILL_WAIT_S = 10.0  # how long a killed sandbox of the fork server may take to be gone


def image_store() -> ImageStore:
    """This process's view of the node's image cache (UNI_AGENT_IMAGE_CACHE), made on first use."""
    root = os.environ.get("UNI_AGENT_IMAGE_CACHE", "")
    if root not in _image_stores:
        _image_stores[root] = ImageStore(root or None)
    return _image_stores[root]


_image_stores: dict[str, ImageStore] = {}


class LocalDeploymentConfig(DeploymentBase):
    """A bubblewrap sandbox on this machine. Its root is the host's filesystem, read-only, or with `image` the image's
    root filesystem, copy-on-write; the task repo (`repo`, if given) is mounted copy-on-write at `workdir`."""

    type: Literal["local"] = "local"
    image: str | None = None
    """A container image to run in, unpacked once per node (no container runtime needed): a registry reference
    (fetched with skopeo, or from a local podman), `oci:DIR[:TAG]`, `oci-archive:FILE` or `docker-archive:FILE`.
    Its Env, WorkingDir and User apply. None: the host's own /usr, read-only."""
    repo: str | None = None
    """The task repository: a directory, or `bundled:<instance_id>` for a bundled task. Optional with `image`
    (the image's own `workdir` then, e.g. SWE-bench's /testbed)."""
    workdir: str = "/testbed"
    network: bool = False
    workspace: Literal["auto", "overlay", "copy"] = "auto"
    """overlay: copy-on-write through overlayfs (as root, or without root in a user namespace of the sandbox's own);
    copy: a full copy at every start; auto: overlay where the kernel allows one (else a copy, said once in the log)."""
    max_memory_mb: int | None = 4096
    """RLIMIT_AS per process inside the sandbox, in MiB; None for no limit."""
    pids_limit: int | None = Field(default=1024, ge=16)
    """Processes (and threads) the whole sandbox may run at once, so a fork bomb stays inside it: a pids cgroup per
    sandbox where one is writable (root), else `ulimit -u` (binds non-root workers only); None for no limit."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Host directories bound read-only into the sandbox, {path inside: directory on the host}: a program's prepared
    environment (uni_agent.harness; `harness.mounts` adds to these). Choose paths outside /usr (e.g. /opt/NAME)."""
    cpu_nice: int = Field(default=0, ge=0, le=19)
    """How far below the worker the sandbox's processes run for the CPU, as `nice` counts (0: level with it, 19:
    last): a polite setting for a node shared with others. Not a speed-up: at 10 the rollouts ran no faster, and on
    16 cores slower, their sandbox starts and commands waiting longer (docs/benchmarks.md, "Sandbox sessions and CPU
    priority")."""
    command_slots: int = Field(default=DEFAULT_SLOTS, ge=0)
    """Commands of one worker process that may begin at once, first come first served (0: no limit). A turn's
    burst of commands then runs in order instead of sharing the cores until nearly all end together
    (uni_agent/sandbox/command_gate.py)."""
    command_hold_s: float = Field(default=DEFAULT_HOLD_S, gt=0)
    """How long a running command keeps its slot at most: a longer one lets the next begin and runs on."""
    launcher: Literal["auto", "fork_server", "bwrap"] = "auto"
    """How a sandbox is started. fork_server: forked by the worker's fork server, a process that pays for bwrap and
    the interpreter once (one per worker process; ~3 ms of CPU a start); bwrap: a bwrap, a mount and a Python
    interpreter of its own (~30 ms); auto: the fork server where it serves the sandbox (the host's root, an overlay
    workspace, no network, no extra mounts) and works on this machine."""

    def build(self, env_variables: dict[str, str], name: str = "") -> LocalSandbox:
        return LocalSandbox(self, env_variables, name=name)


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
        self._userns: UserNamespace | None = None  # the user namespace the chain starts in (not as root)
        self._fork_server: ForkServer | None = None  # the fork server that forked this sandbox, if one did
        self._fork_server_transport: Transport | None = None
        self.process_limit = ProcessLimit(self.name, config.pids_limit)
        self.command_gate = command_gate(config.command_slots, config.command_hold_s)

    extra_env = {"GIT_CONFIG_GLOBAL": "/dev/null"}

    # -- where it lives ----------------------------------------------------------------------------------------
    async def _launch(self) -> Transport:
        if shutil.which("bwrap") is None:
            raise SandboxStartError("bubblewrap (bwrap) is not installed; apt-get install bubblewrap")
        self._userns = await asyncio.to_thread(user_namespace)
        if self.config.image:
            self._lease = await to_thread_kept(image_store().open, self.config.image)
            if "workdir" not in self.config.model_fields_set and self._lease.image.workdir:
                self.workdir = self._lease.image.workdir  # the image's WorkingDir, unless the row names one
            self._check_user(self._lease.image)
        if self.config.repo:
            self._base = await asyncio.to_thread(prepare_base_repo, resolve_repo(self.config.repo))
        root = await asyncio.to_thread(sandbox_root)
        if reap_due(root):
            await asyncio.to_thread(reap_orphaned_sandboxes, root)
        image_dirs = ("root-upper", "root-work", "root") if self._lease is not None else ()
        self.dir = await to_thread_kept(
            make_private_subdir, root, self.name, ("upper", "work", "merged", "tmp", "home", STATE_DIR_ON_HOST,
                                                   *image_dirs), {OWNER_FILE: str(os.getpid())})
        self.process_limit.create()
        self.use_overlay = await overlay_wanted(self.config.workspace, self._userns, root)
        if not self.use_overlay:
            await self._copy_workspace()
        if self._lease is not None and not os.path.lexists(self._lease.image.rootfs / "run"):
            # bwrap would make /run for the state dir itself, mode 0700: closed to an image's User
            os.mkdir(self.dir / ("root-upper" if self.use_overlay else "root") / "run", 0o755)
        if self._switches_user() and self._userns is None:  # as root; in a namespace, its setup script does it
            for sub in self._user_dirs():
                os.chown(sub, self._lease.image.uid, self._lease.image.gid)  # type: ignore[union-attr]
        if self._fork_server_serves():
            transport = await self._launch_in_fork_server()
            if transport is not None:
                return transport
        self._proc = await self._spawn(self._argv(self.use_overlay))
        return process_transport(self._proc, "bwrap")

    def _fork_server_serves(self) -> bool:
        """Whether the worker's fork server (fork_server.py) can start this sandbox."""
        if self.config.launcher == "bwrap":
            return False
        why = self._why_not_fork_server()
        if why and self.config.launcher == "fork_server":
            raise SandboxError(f"sandbox {self.name}: `launcher: fork_server` cannot start it: {why} (`launcher: auto` "
                               "starts such sandboxes with a bwrap of their own)")
        return not why

    def _why_not_fork_server(self) -> str:
        return fork_server_refusal(self.config, overlay_over_repo=self.use_overlay and self._base is not None)

    async def _launch_in_fork_server(self) -> Transport | None:
        """The sandbox forked by the fork server; None where no fork server works here (`launcher: auto` then starts a
        bwrap)."""
        assert self.dir is not None and self._base is not None
        cgroup = self.process_limit.cgroup
        key = ForkServerKey(self.dir.parent, self._base.parent, cgroup.parent if cgroup is not None else None,
                            self.config.cpu_nice)  # warm_fork_server builds the same for its config
        env = host_env()
        limit_as = self.config.max_memory_mb * 1024 * 1024 if self.config.max_memory_mb else 0
        # The first shell's state comes with the launch: the supervisor's environment, its working directory.
        request = {"name": self.name, "dir": self.dir.name, "lower": f"repos/{self._base.name}",
                   "workdir": self.workdir, "env": {**env, **self.first_environment()}, "as_bytes": limit_as,
                   "cgroup": cgroup.name if cgroup is not None else "",
                   "nproc": self.process_limit.max_processes if self.process_limit.mode == "ulimit" else 0}
        for attempt in range(2):  # a fork server that ended for idleness as we took it: the next one
            fork_server = running_fork_server(key) or await asyncio.to_thread(fork_server_for, key, env)
            if fork_server is None:
                if self.config.launcher == "fork_server":
                    raise SandboxError(f"sandbox {self.name}: `launcher: fork_server`, but the fork server does not "
                                       f"work here: {fork_server_failure(key)}")
                return None
            try:
                stdin_w, stdout_r = fork_server.start(request)
                break
            except ForkServerClosed:
                if attempt:
                    raise
        self._fork_server = fork_server
        self.launched_ready = True

        async def describe_end() -> str:
            state = "running" if fork_server.alive else f"gone{fork_server_stderr(fork_server)}"
            return f"the sandbox's pid 1 in the fork server (pid {fork_server.proc.pid}, {state}) ended"

        self._fork_server_transport = await pipe_transport(stdin_w, stdout_r, describe_end)
        return self._fork_server_transport

    def _switches_user(self) -> bool:
        return self._lease is not None and self._lease.image.uid != 0

    def _user_dirs(self) -> list[Path]:
        """What the image's User must be able to write."""
        assert self.dir is not None
        return [self.dir / sub for sub in (STATE_DIR_ON_HOST, "upper", "merged")]

    def _check_user(self, image: ImageRootfs) -> None:
        """An image's User that cannot be switched to here is a clear error, not a retried start."""
        if image.uid == 0 or os.geteuid() == 0:
            return
        namespace = self._userns
        if namespace is None:
            why = "unprivileged user namespaces are refused here"
        elif not namespace.subordinate:
            why = NO_SUBORDINATE_IDS
        elif max(image.uid, image.gid) >= namespace.ids:
            why = f"your subordinate ids map only 0..{namespace.ids - 1} (a larger range in /etc/subuid, /etc/subgid)"
        else:
            return
        raise SandboxError(f"image {image.reference!r} runs as User {image.uid}:{image.gid}, which needs root or "
                           f"subordinate ids: {why}")

    async def _copy_workspace(self) -> None:
        """Full copies, where no overlay can be mounted (slow for an image: seconds and its size on disk each)."""
        if self._userns is None:
            await asyncio.to_thread(self._copy_layers)
            return
        for lower, _, _, target in self._layers():  # as root of the namespace, so that the image's owners stay
            proc = await asyncio.create_subprocess_exec(
                *self._userns.argv(mount=False), "cp", "-a", "--", f"{lower}/.", str(target),
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
            _, err = await proc.communicate()
            if proc.returncode != 0:
                raise SandboxStartError(f"copying {lower} into sandbox {self.name} failed: "
                                        f"{err.decode(errors='replace').strip()[-1000:]}")

    def _copy_layers(self) -> None:
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

    async def _spawn(self, argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, limit=1 << 20)

    def _argv(self, overlay: bool) -> list[str]:
        # The cgroup is joined first, so the whole sandbox (bwrap, supervisor, commands) counts against pids.max.
        prefix = self.process_limit.command_prefix() + ["setpriv", "--pdeathsig", "KILL"]
        if self.config.cpu_nice:
            prefix += ["nice", "-n", str(self.config.cpu_nice)]
        return prefix + self._namespace_prefix(overlay) + self._bwrap_args()

    def _namespace_prefix(self, overlay: bool) -> list[str]:
        """The namespaces the chain enters before bwrap, and its setup there: the image's User's dirs handed to it
        (in a user namespace, where the caller is root), each copy-on-write tree mounted (with `overlay`)."""
        trees = [str(path) for layer in self._layers() for path in layer] if overlay else []
        if self._userns is not None:
            image = self._lease.image if self._lease is not None and self._switches_user() else None
            owner = f"{image.uid}:{image.gid}" if image is not None else ""
            dirs = [str(path) for path in self._user_dirs()] if image is not None else []
            return [*self._userns.argv(mount=True), "sh", "-c", SETUP_SCRIPT, "sh", owner, *dirs, "--", *trees, "--"]
        if overlay:
            return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SETUP_SCRIPT, "sh", "", "--",
                    *trees, "--"]
        return []

    async def _teardown(self) -> None:
        await self._end_in_fork_server()
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
            await remove_in_removal_thread(self.dir)
            self.dir = None

    async def _end_in_fork_server(self) -> None:
        """As for a bwrap of its own: a moment to exit by itself (its stdin is closed), then killed; waited for until
        its pid 1, and every process of the sandbox with it, is gone."""
        fork_server, self._fork_server = self._fork_server, None
        if fork_server is None:
            return
        if self._fork_server_transport is not None:  # its stdin's end of file (also where no session began) ends it
            self._fork_server_transport.close()
            self._fork_server_transport = None
        ended = asyncio.wrap_future(fork_server.ended(self.name))
        try:
            await asyncio.wait_for(asyncio.shield(ended), CLOSE_GRACE_S)
        except TimeoutError:
            fork_server.kill(self.name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ended, FORK_SERVER_KILL_WAIT_S)

    async def exec(self, command: str, timeout: float, *, stdin: bytes | None = None,
                   merge_stderr: bool = True) -> ExecResult:
        if self.dir is not None and not os.path.isdir(self.dir):  # a stat: cheap next to the command
            raise SandboxError(f"sandbox {self.name} is gone: {self.dir} was removed while in use")
        return await super().exec(command, timeout, stdin=stdin, merge_stderr=merge_stderr)

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
                          shell_limits=" ".join(limits), read_only=self.config.mounts)


def fork_server_refusal(config: LocalDeploymentConfig, overlay_over_repo: bool = True) -> str:
    """Why the fork server cannot fork `config`'s sandboxes ("" where it can): a sandbox's start (its workspace known)
    and the warm-up (before any sandbox, the overlay probed apart) ask the same."""
    if config.image:
        return "it runs an image"
    if not overlay_over_repo:
        return "its workspace is not an overlay over a task repo"
    if config.network:
        return "it has the network"
    if config.mounts:
        return "it has extra mounts"
    return ""


async def warm_fork_server(config: LocalDeploymentConfig | None = None) -> bool:
    """The fork server that `config`'s sandboxes (default: the default local deployment's) would get, started and
    probed now, with the process's overlay probe: what a worker's first sandbox otherwise pays while the rest of its
    first wave waits (one fork server boots per worker: 70-80 ms alone on 2 cores, 250-350 ms with 12 workers booting
    on 16 busy cores, docs/benchmarks.md). Quiet (no log line: it runs at a worker's start, before a run's logs
    exist, and the worker's output may be its caller's); False where no fork server would serve. A warmed fork
    server with no sandbox ends after FORK_SERVER_IDLE_S like any other."""
    config = config or LocalDeploymentConfig()
    if config.launcher == "bwrap" or config.workspace == "copy" or fork_server_refusal(config):
        return False
    if shutil.which("bwrap") is None:
        return False
    userns = await asyncio.to_thread(user_namespace, True)  # quiet: what is missing, the first sandbox says
    if os.geteuid() != 0 and userns is None:
        return False  # no overlay without root or a user namespace, so no fork server
    root = await asyncio.to_thread(sandbox_root)
    if not await overlay_wanted(config.workspace, userns, root, quiet=True):
        return False
    repos = cache_root() / REPOS_DIR
    await asyncio.to_thread(repos.mkdir, parents=True, exist_ok=True)
    cgroups = await asyncio.to_thread(pids_cgroup_parent, True) if config.pids_limit else None
    key = ForkServerKey(root, repos, cgroups, config.cpu_nice)
    if running_fork_server(key) is not None:
        return True
    return await asyncio.to_thread(functools.partial(fork_server_for, key, host_env(), quiet=True)) is not None
