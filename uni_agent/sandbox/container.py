"""The container backend: one long-lived container per sandbox, driven through the docker or podman CLI.

start: `run -i --rm` the image with the sandbox supervisor (supervisor.py) as its main process, attached: the `run`
client's stdin/stdout are the session (session.py), so every command is a message, not a `podman exec` (191 ms
each). No network by default, cpu/memory/pids limits and explicit ulimits, a unique name and labels
(`uni-agent.sandbox=1`, `uni-agent.created=<epoch>`, `uni-agent.owner=<host>:<pid>`) that `reap()`
(container_reap.py) finds leftovers by. The supervisor ends the container by itself when the deployment's lifetime
is up, so even a container whose owner crashed goes. Then the task repository is copied in when the config names
one, and a probe command runs.
close: the supervisor's stdin is closed (it ends every process) and the container is removed (`rm -f`), on every
path. Every CLI call is an asyncio subprocess: nothing blocks the event loop. The image needs python3 (>= 3.6) and
bash: the supervisor is a python3 program and commands run in bash.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Sequence
from typing import Literal

import structlog
from pydantic import Field

from .backend import SessionSandbox, Transport, process_transport
from .base import ImageDeploymentBase, SandboxError, SandboxStartError
from .container_reap import CREATED_LABEL, LABEL, OWNER_LABEL, cli_text, owner_id, remove_containers
from .limiter import start_limits
from .repo import prepare_base_repo, resolve_repo
from .supervisor_launch import supervisor_shell_argv

log = structlog.get_logger("uni_agent.sandbox")

CLI_TIMEOUT_S = 120.0  # one CLI call other than run/pull (inspect, rm, cp of a small repo)
RUN_CLIENT_EXIT_S = 30.0  # how long close() lets the `run` client finish before removing the container anyway


def lifetime_s(deployment_timeout: float) -> int:
    """How long a sandbox may live at most: the deployment's timeout and a margin; it then ends by itself."""
    return math.ceil(deployment_timeout + min(60.0, deployment_timeout))


def sandbox_name(name: str) -> str:
    """`uni-agent-<name>-<8 hex>`, with only the characters container names (and Modal names) allow."""
    cleaned = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-")[:40] or "sbx"
    return f"uni-agent-{cleaned}-{uuid.uuid4().hex[:8]}"


class ContainerDeploymentConfig(ImageDeploymentBase):
    """A long-lived container per sandbox, driven through the docker or podman CLI (`type` picks the CLI).

    The image must hold the task repository at `workdir` (SWE-bench images hold /testbed), or `repo` names one to
    copy in at start. The defaults are those that work with rootful podman + runc on Debian (see docs/sandboxes.md)."""

    type: Literal["docker", "podman"] = "podman"
    repo: str | None = None
    """A repository to copy into `workdir` at start: a directory, or `bundled:<instance_id>`. None: the image's."""
    workdir: str = "/testbed"
    pull: Literal["never", "missing", "always"] = "missing"
    """never: the image must be present locally; missing: pull when absent; always: pull before every start."""
    network: str = "none"
    """`none` (no network), or a network the CLI knows (`bridge`, `host`, a named network)."""
    mounts: dict[str, str] = Field(default_factory=dict)
    """Host directories bound read-only into the sandbox, {path inside: directory on the host}: a program's prepared
    environment (uni_agent.harness; `harness.mounts` adds to these). Choose paths outside /usr (e.g. /opt/NAME)."""
    cpus: float | None = Field(default=None, gt=0)
    memory: str | None = "4g"
    """Memory limit in the CLI's syntax (`512m`, `4g`); None for no limit."""
    pids_limit: int | None = Field(default=4096, ge=1)
    ulimits: list[str] = Field(default_factory=lambda: ["nofile=4096:4096", "nproc=4096:4096"])
    """`--ulimit` values; podman's own defaults fail where root lacks CAP_SYS_RESOURCE, so they are explicit."""
    runtime: str | None = "runc"
    """OCI runtime (`--runtime`); None for the engine's default. Debian's podman needs runc (crun fails there)."""
    init: bool = True
    """Run an init process as PID 1 (`--init`), which reaps the zombies of killed commands."""
    cli: str | None = None
    """Path of the CLI binary; default: `docker` or `podman` from PATH, after `type`."""
    run_args: list[str] = Field(default_factory=list)
    """Extra arguments for `run` (before the image), e.g. ["--security-opt", "label=disable"]."""
    max_starting: int = Field(default=8, ge=1)
    """Containers of this process that may be starting at once."""

    def build(self, env_variables: dict[str, str], name: str = "") -> ContainerSandbox:
        return ContainerSandbox(self, env_variables, name=name)


# -- the container CLI ------------------------------------------------------------------------------------------------


class ContainerSandbox(SessionSandbox):
    def __init__(self, config: ContainerDeploymentConfig, env_variables: dict[str, str] | None = None, name: str = ""):
        if not config.image:
            raise SandboxError(f"{config.type} deployment needs `image`")
        super().__init__(config, env_variables, sandbox_name(name))
        self.cli = config.cli or config.type
        self._cli_env = _proxy_env(config.proxy)
        self._created = False  # a `run` was issued: close() must remove the container, whatever happened after
        self._run_proc: asyncio.subprocess.Process | None = None
        self._procs: set[asyncio.subprocess.Process] = set()

    # -- where it lives ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} was closed")
        if shutil.which(self.cli) is None:
            raise SandboxError(f"the {self.config.type} CLI ({self.cli!r}) is not installed")
        if self.config.pull == "never" and not await self._image_present():
            raise SandboxError(f"image {self.config.image!r} is not present locally and pull is `never`")
        limits = start_limits(("container", self.cli), self.config.max_starting)
        started = time.monotonic()
        async with limits.cap.slot():
            try:
                async with asyncio.timeout(self.config.startup_timeout):
                    await super().start()
            except TimeoutError:
                raise SandboxStartError(
                    f"container {self.name} did not start within startup_timeout={self.config.startup_timeout:g}s"
                ) from None
        log.debug("container_started", name=self.name, seconds=round(time.monotonic() - started, 3))

    async def _launch(self) -> Transport:
        self._created = True
        self._run_proc = await self._spawn(self._run_argv(), with_stdin=True, limit=1 << 20)
        return process_transport(self._run_proc, f"`{self.cli} run`")

    async def _provision(self) -> None:
        if self.config.repo is None:
            return
        base = await asyncio.to_thread(prepare_base_repo, resolve_repo(self.config.repo))
        rc, _, err = await self._cli_call(["cp", f"{base}/.", f"{self.name}:{self.workdir}"], timeout=None)
        if rc != 0:
            raise SandboxStartError(f"could not copy the repository into {self.name}: {cli_text(err)}")

    def _run_argv(self) -> list[str]:
        c = self.config
        argv = ["run", "-i", "--rm", "--name", self.name,
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
        for inside, host in c.mounts.items():  # read-only: a harness's prepared environment (uni_agent.harness)
            argv += ["--volume", f"{host}:{inside}:ro"]
        shell, *args = supervisor_shell_argv(self.state_dir, lifetime_s(c.deployment_timeout))
        argv += [*c.run_args, "--entrypoint", shell, c.image, *args]
        return argv

    def _global_args(self) -> list[str]:
        if self.config.type == "podman" and self.config.runtime:
            return ["--runtime", self.config.runtime]
        return []

    async def _image_present(self) -> bool:
        rc, _, _ = await self._cli_call(["image", "inspect", "--format", "{{.Id}}", self.config.image or ""])
        return rc == 0

    async def _teardown(self) -> None:
        """Remove the container. Safe to call twice, after a failed or cancelled start, and while cancelled.

        The `run` client is let finish first (its stdin closed: the supervisor exits and `--rm` removes the
        container): killed halfway through creating the container, it would leave one behind that `rm` ran too
        early to see."""
        for proc in list(self._procs):
            if proc is not self._run_proc:
                _kill_group(proc)
        proc, self._run_proc = self._run_proc, None
        if proc is not None:
            if proc.stdin is not None and not proc.stdin.is_closing():
                proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), RUN_CLIENT_EXIT_S)
        if self._created:
            self._created = False
            if not await remove_containers(self.cli, [self.name], self._global_args(), self._cli_env):
                log.error("container_not_removed", name=self.name, hint=f"{self.cli} rm -f {self.name}")
        if proc is not None:
            _kill_group(proc)
            await proc.wait()
            self._procs.discard(proc)

    # -- subprocesses ------------------------------------------------------------------------------------------
    async def _spawn(self, args: Sequence[str], with_stdin: bool, limit: int = 1 << 16) -> asyncio.subprocess.Process:
        proc = await asyncio.create_subprocess_exec(
            self.cli, *self._global_args(), *args,
            stdin=asyncio.subprocess.PIPE if with_stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=self._cli_env, start_new_session=True, limit=limit,
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


def _proxy_env(proxy: str | None) -> dict[str, str] | None:
    if not proxy:
        return None  # inherit
    return {**os.environ, "HTTPS_PROXY": proxy, "HTTP_PROXY": proxy, "https_proxy": proxy, "http_proxy": proxy}


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


if __name__ == "__main__":  # `python -m uni_agent.sandbox.container reap ...` (docs/sandboxes.md): lives with `reap`
    from .container_reap import main

    main()
