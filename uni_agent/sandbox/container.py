"""The container backend: one long-lived container per sandbox, driven through the docker or podman CLI.

start: `run -d --rm` the image with `sleep <lifetime>` as its command (so even a container whose owner crashed ends
by itself when the deployment's lifetime is up), no network by default, cpu/memory/pids limits and explicit ulimits,
a unique name and labels (`uni-agent.sandbox=1`, `uni-agent.created=<epoch>`) that `reap()` finds leftovers by; then
install the shell protocol below, copy the task repository in when the config names one, and run a probe command.
close: `rm -f`, on every path. Every CLI call is an asyncio subprocess: nothing blocks the event loop.

The in-sandbox shell protocol (shared with the Modal backend): each command is a fresh `bash` that restores the
working directory and exported variables saved by the previous one (the local backend's runner script and its EXIT
trap), started as `timeout -s KILL T`, so a command that hangs is killed inside the sandbox with its whole process
group even when the client that started it is gone. The launcher records its pid (= the group) in a file, so a
cancelled command is killed from outside too: killing `podman exec` alone would leave it running in the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import math
import os
import re
import shlex
import shutil
import signal
import socket
import tarfile
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import structlog

from ..config import ContainerDeploymentConfig
from .base import ClosingContext, ExecResult, SandboxError, SandboxStartError
from .limiter import start_limits
from .local import (
    RUNNER_SCRIPT,
    STATE_DIR_IN_SANDBOX,
    _feed,
    _read_capped,
    prepare_base_repo,
    resolve_repo,
)

log = structlog.get_logger("uni_agent.sandbox")

LABEL = "uni-agent.sandbox"
CREATED_LABEL = "uni-agent.created"
OWNER_LABEL = "uni-agent.owner"  # <hostname>:<pid> of the process that started it


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
HOST_GRACE_S = 5.0
"""How long past a command's timeout the host waits before it kills the command from outside (the in-sandbox
`timeout` normally acts first)."""
CLI_TIMEOUT_S = 120.0  # one CLI call other than run/pull/exec (inspect, rm, cp of a small repo)

# -- the in-sandbox shell protocol (also used by modal.py) -----------------------------------------------------------

STATE = STATE_DIR_IN_SANDBOX
EXEC_SCRIPT = f"""UA_MERGE_STDERR=$1
if [ "$3" = staged ]; then mv -f {STATE}/cmd.next {STATE}/cmd.sh || exit 125
else printf '%s\\n' "$2" > {STATE}/cmd.sh || exit 125; fi
set --
source {STATE}/run.sh
"""
LAUNCH_SCRIPT = (f'echo $$ > {STATE}/exec.pid && '
                 f'exec timeout -s KILL "$1" bash --noprofile --norc {STATE}/exec.sh "$2" "$3" "$4"')
STAGE_ARGV = ["/bin/sh", "-c", f"cat > {STATE}/cmd.next"]
MAX_ARGV_COMMAND_BYTES = 64 * 1024
"""Longer commands are staged through stdin first: one argv string may not exceed 128 KiB (MAX_ARG_STRLEN)."""
KILL_SCRIPT = f'p=$(cat {STATE}/exec.pid 2>/dev/null) && [ -n "$p" ] && kill -KILL -- "-$p" "$p" 2>/dev/null; true'
SHELL_NEEDS = "sh, bash, tar and coreutils' timeout"
GIT_AUTHOR = {
    "GIT_AUTHOR_NAME": "uni-agent",
    "GIT_AUTHOR_EMAIL": "uni-agent@localhost",
    "GIT_COMMITTER_NAME": "uni-agent",
    "GIT_COMMITTER_EMAIL": "uni-agent@localhost",
}


def shell_setup(workdir: str, env_variables: dict[str, str]) -> tuple[list[str], bytes]:
    """The argv and stdin (a tar archive) that install the protocol's scripts and the first command's state."""
    env = {**GIT_AUTHOR, **env_variables}
    state = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items()) + f"cd -- {shlex.quote(workdir)}\n"
    files = {"run.sh": RUNNER_SCRIPT.format(state=STATE), "exec.sh": EXEC_SCRIPT, "state.sh": state}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
            tar.addfile(info, io.BytesIO(data))
    command = f"mkdir -p {STATE} {shlex.quote(workdir)} && tar -C {STATE} -xf -"
    return ["/bin/sh", "-c", command], buffer.getvalue()


def needs_staging(command: str) -> bool:
    return len(command.encode()) > MAX_ARGV_COMMAND_BYTES


def launch_argv(command: str, timeout: float, merge_stderr: bool) -> list[str]:
    """The argv that runs one command under the protocol, killed with its process group at `timeout` seconds.
    A command too long for argv must have been written with STAGE_ARGV (its stdin) just before."""
    staged = needs_staging(command)
    return ["/bin/sh", "-c", LAUNCH_SCRIPT, "uni-agent", f"{max(timeout, 0.001):.3f}", "1" if merge_stderr else "0",
            "" if staged else command, "staged" if staged else "argv"]


def kill_argv() -> list[str]:
    return ["bash", "--noprofile", "--norc", "-c", KILL_SCRIPT]  # dash's kill takes no `--` before a group


def killed_at_timeout(exit_code: int | None, duration_s: float, timeout: float) -> bool:
    """`timeout -s KILL` exits 137; a command that was SIGKILLed for another reason (OOM) ends before the timeout."""
    return exit_code == 128 + signal.SIGKILL and duration_s >= timeout * 0.98


def archive_tree(root: Path) -> bytes:
    """A tar of `root` (the task's git snapshot, .git included), to unpack at the workdir through exec stdin."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(root, arcname=".")
    return buffer.getvalue()


def sandbox_name(name: str) -> str:
    """`uni-agent-<name>-<8 hex>`, with only the characters container names (and Modal names) allow."""
    cleaned = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-")[:40] or "sbx"
    return f"uni-agent-{cleaned}-{uuid.uuid4().hex[:8]}"


# -- the container CLI ------------------------------------------------------------------------------------------------


class ContainerSandbox(ClosingContext):
    def __init__(self, config: ContainerDeploymentConfig, env_variables: dict[str, str] | None = None, name: str = ""):
        if not config.image:
            raise SandboxError(f"{config.type} deployment needs `image`")
        self.config = config
        self.workdir = config.workdir
        self.env_variables = dict(env_variables or {})
        self.name = sandbox_name(name)
        self.cli = config.cli or config.type
        self._cli_env = _proxy_env(config.proxy)
        self._created = False  # a `run` was issued: close() must remove the container, whatever happened after
        self._running = False
        self._closed = False
        self._lock = asyncio.Lock()
        self._procs: set[asyncio.subprocess.Process] = set()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} was closed")
        if shutil.which(self.cli) is None:
            raise SandboxError(f"the {self.config.type} CLI ({self.cli!r}) is not installed")
        limits = start_limits(("container", self.cli), self.config.max_starting)
        started = time.monotonic()
        async with limits.cap.slot():
            try:
                async with asyncio.timeout(self.config.startup_timeout):
                    await self._start()
            except TimeoutError:
                raise SandboxStartError(
                    f"container {self.name} did not start within startup_timeout={self.config.startup_timeout:g}s"
                ) from None
        log.debug("container_started", name=self.name, seconds=round(time.monotonic() - started, 3))

    async def _start(self) -> None:
        config = self.config
        if config.pull == "never" and not await self._image_present():
            raise SandboxError(f"image {config.image!r} is not present locally and pull is `never`")
        self._created = True
        rc, _, err = await self._cli_call(self._run_argv(), timeout=None)
        if rc != 0:
            raise SandboxStartError(f"{self.cli} run failed (exit {rc}): {_text(err)}")
        self._running = True
        argv, archive = shell_setup(self.workdir, self.env_variables)
        rc, out, err = await self._cli_call(["exec", "-i", self.name, *argv], stdin=archive, timeout=None)
        if rc != 0:
            raise SandboxStartError(f"could not set up the shell in {self.name} (the image needs {SHELL_NEEDS}): "
                                    f"exit {rc}: {_text(out + err)}")
        if config.repo is not None:
            base = await asyncio.to_thread(prepare_base_repo, resolve_repo(config.repo))
            rc, _, err = await self._cli_call(["cp", f"{base}/.", f"{self.name}:{self.workdir}"], timeout=None)
            if rc != 0:
                raise SandboxStartError(f"could not copy the repository into {self.name}: {_text(err)}")
        probe = await self.exec("true", timeout=max(1.0, self.config.startup_timeout))
        if probe.exit_code != 0:
            raise SandboxStartError(f"container {self.name} does not run commands (the image needs {SHELL_NEEDS}): "
                                    f"exit {probe.exit_code}: {probe.output.strip()[-2000:]}")

    def _run_argv(self) -> list[str]:
        c = self.config
        lifetime = math.ceil(c.deployment_timeout + min(60.0, c.deployment_timeout))
        argv = ["run", "-d", "--rm", "--name", self.name,
                "--label", f"{LABEL}=1", "--label", f"{CREATED_LABEL}={int(time.time())}",
                "--label", f"{OWNER_LABEL}={owner_id()}",
                "--network", c.network, "--pull", c.pull]
        if c.runtime and self.config.type == "docker":
            argv += ["--runtime", c.runtime]  # podman takes it as a global flag (see _global_args)
        if c.cpus is not None:
            argv += ["--cpus", f"{c.cpus:g}"]
        if c.memory is not None:
            argv += ["--memory", c.memory]
        if c.pids_limit is not None:
            argv += ["--pids-limit", str(c.pids_limit)]
        for ulimit in c.ulimits:
            argv += ["--ulimit", ulimit]
        if c.init:
            argv.append("--init")
        argv += [*c.run_args, "--entrypoint", "sleep", c.image, str(lifetime)]
        return argv

    def _global_args(self) -> list[str]:
        if self.config.type == "podman" and self.config.runtime:
            return ["--runtime", self.config.runtime]
        return []

    async def _image_present(self) -> bool:
        rc, _, _ = await self._cli_call(["image", "inspect", "--format", "{{.Id}}", self.config.image or ""])
        return rc == 0

    async def close(self) -> None:
        """Remove the container. Safe to call twice, after a failed or cancelled start, and while cancelled."""
        self._closed = True
        self._running = False
        for proc in list(self._procs):
            _kill_group(proc)
        if not self._created:
            return
        self._created = False
        if not await remove_containers(self.cli, [self.name], self._global_args(), self._cli_env):
            log.error("container_not_removed", name=self.name, hint=f"{self.cli} rm -f {self.name}")

    # -- commands ----------------------------------------------------------------------------------------------
    async def exec(
        self, command: str, timeout: float, *, stdin: bytes | None = None, merge_stderr: bool = True
    ) -> ExecResult:
        if not self._running:
            raise SandboxError(f"sandbox {self.name} is not running")
        async with self._lock:  # one command at a time: they share the command file and the shell state
            return await self._exec(command, min(timeout, self.config.runtime_timeout), stdin, merge_stderr)

    async def _exec(self, command: str, timeout: float, stdin: bytes | None, merge_stderr: bool) -> ExecResult:
        if needs_staging(command):
            rc, _, err = await self._cli_call(["exec", "-i", self.name, *STAGE_ARGV], stdin=command.encode())
            if rc != 0:
                raise SandboxError(f"could not pass a {len(command)}-character command to {self.name}: {_text(err)}")
        argv = ["exec", *(["-i"] if stdin is not None else []), self.name, *launch_argv(command, timeout,
                                                                                          merge_stderr)]
        started = time.monotonic()
        proc = await self._spawn(argv, stdin is not None)
        io_ = asyncio.gather(_read_capped(proc.stdout), _read_capped(proc.stderr), _feed(proc, stdin), proc.wait())
        host_timeout = False
        try:
            try:
                (out, dropped_out), (err, dropped_err), _, _ = await asyncio.wait_for(
                    asyncio.shield(io_), timeout + HOST_GRACE_S)
            except TimeoutError:  # the in-container timeout did not end it: kill it from outside
                host_timeout = True
                await self._kill_running_command()
                _kill_group(proc)
                (out, dropped_out), (err, dropped_err), _, _ = await io_
        except BaseException:
            _kill_group(proc)
            io_.cancel()
            io_.add_done_callback(_retrieve)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(self._kill_running_command())
            raise
        finally:
            self._procs.discard(proc)
        duration = time.monotonic() - started
        rc = proc.returncode
        timed_out = host_timeout or killed_at_timeout(rc, duration, timeout)
        if not timed_out and rc != 0 and (rc == 125 or (merge_stderr and err)) and not await self._is_running():
            self._running = False
            raise SandboxError(f"container {self.name} is gone: {_text(err)}")
        return ExecResult(stdout=out, stderr=err, exit_code=None if timed_out else rc, timed_out=timed_out,
                          duration_s=duration, truncated_bytes=dropped_out + dropped_err)

    async def _kill_running_command(self) -> None:
        await self._cli_call(["exec", self.name, *kill_argv()], timeout=30)

    async def _is_running(self) -> bool:
        rc, out, _ = await self._cli_call(["inspect", "--format", "{{.State.Running}}", self.name])
        return rc == 0 and out.strip() == b"true"

    # -- subprocesses ------------------------------------------------------------------------------------------
    async def _spawn(self, args: Sequence[str], with_stdin: bool) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            self.cli, *self._global_args(), *args,
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=self._cli_env, start_new_session=True,
            cwd=tempfile.gettempdir(),  # podman's conmon drops an `oom` marker file into its working directory
        )
        self._procs.add(proc)
        return proc

    async def _cli_call(self, args: Sequence[str], *, stdin: bytes | None = None,
                        timeout: float | None = CLI_TIMEOUT_S) -> tuple[int, bytes, bytes]:
        """Run one CLI command to completion; killed (and reaped) when cancelled or past `timeout`."""
        proc = await self._spawn(args, stdin is not None)
        try:
            async with asyncio.timeout(timeout):
                out, err = await proc.communicate(stdin)
        except BaseException:
            _kill_group(proc)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(proc.wait())
            raise
        finally:
            self._procs.discard(proc)
        assert proc.returncode is not None
        return proc.returncode, out, err


async def remove_containers(cli: str, names: Sequence[str], global_args: Sequence[str] = (),
                            env: dict[str, str] | None = None, attempts: int = 3) -> bool:
    """`rm -f` the containers (podman: without the 10 s stop grace). Not killed when the caller is cancelled: once
    started, the removal runs to its end. True when none of them is left."""
    if not names:
        return True
    force = ["rm", "-f", "-t", "0"] if Path(cli).name == "podman" else ["rm", "-f"]
    for attempt in range(attempts):
        proc = await asyncio.create_subprocess_exec(
            cli, *global_args, *force, *names, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
        )
        _, err = await asyncio.shield(proc.communicate())
        gone = proc.returncode == 0 or all(_no_such_container(err, n) for n in names)
        if gone:
            return True
        log.warning("container_rm_failed", names=list(names), attempt=attempt + 1, error=_text(err))
    return False


def _no_such_container(err: bytes, name: str) -> bool:
    text = err.decode("utf-8", "replace").lower()
    return name.lower() in text and ("no such container" in text or "no container with name" in text)


async def list_containers(cli: str = "podman", older_than_s: float = 0.0, skip_live_owners: bool = False
                          ) -> list[str]:
    """Names of the containers labelled as uni-agent sandboxes created more than `older_than_s` seconds ago;
    with `skip_live_owners`, not those whose owner is a process still running on this host."""
    proc = await asyncio.create_subprocess_exec(
        cli, "ps", "-a", "--filter", f"label={LABEL}=1", "--format", "{{.Names}}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"{cli} ps failed: {_text(err)}")
    names = out.decode().split()
    if not names:
        return names
    fmt = f'{{{{.Name}}}} {{{{index .Config.Labels "{CREATED_LABEL}"}}}} {{{{index .Config.Labels "{OWNER_LABEL}"}}}}'
    proc = await asyncio.create_subprocess_exec(cli, "inspect", "--format", fmt, *names,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()  # a container that vanished meanwhile is simply missing from the output
    cutoff = time.time() - older_than_s
    host = socket.gethostname()
    found = []
    for line in out.decode().splitlines():
        name, created, owner = (line.strip().split(" ") + ["", ""])[:3]
        if not name or not created.isdigit() or int(created) > cutoff:
            continue
        owner_host, _, owner_pid = owner.rpartition(":")
        if skip_live_owners and owner_host == host and owner_pid.isdigit() and _alive(int(owner_pid)):
            continue
        found.append(name.lstrip("/"))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def reap(cli: str = "podman", older_than_s: float = 3600.0, skip_live_owners: bool = True) -> list[str]:
    """Remove leftover uni-agent containers older than `older_than_s` (e.g. from a process that was killed); by
    default not those whose owner process is still running on this host."""
    names = await list_containers(cli, older_than_s, skip_live_owners)
    if names and not await remove_containers(cli, names):
        raise SandboxError(f"could not remove all of {names}")
    return names


def _proxy_env(proxy: str | None) -> dict[str, str] | None:
    if not proxy:
        return None  # inherit
    return {**os.environ, "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "http_proxy": proxy}


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


def _retrieve(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: a cancelled gather is not reported as "never retrieved"


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").strip()[-2000:]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m uni_agent.sandbox.container reap [--cli podman] [--older-than SECONDS]`"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m uni_agent.sandbox.container")
    sub = parser.add_subparsers(dest="command", required=True)
    reap_cmd = sub.add_parser("reap", help="remove leftover uni-agent sandbox containers")
    reap_cmd.add_argument("--cli", default="podman", help="docker or podman (or a path to either)")
    reap_cmd.add_argument("--older-than", type=float, default=3600.0, help="seconds since creation (default 3600)")
    reap_cmd.add_argument("--include-live-owners", action="store_true",
                          help="also remove containers whose owner process on this host is still running")
    args = parser.parse_args(argv)
    removed = asyncio.run(reap(args.cli, args.older_than, skip_live_owners=not args.include_live_owners))
    print(f"removed {len(removed)} container(s)" + (f": {' '.join(removed)}" if removed else ""))


if __name__ == "__main__":
    main()
