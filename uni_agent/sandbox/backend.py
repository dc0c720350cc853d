"""The skeleton every sandbox backend fills in: where the sandbox lives is the backend's, how commands run is not.

A backend implements three steps: `_launch()` starts the sandbox with the supervisor running in it and returns the
two ends of the supervisor's stdin/stdout; `_provision()` puts the task repository in (when the backend has to copy
it); `_teardown()` removes the sandbox. Everything else (the session, the first shell state, the probe, exec with
timeouts, closing on every path) is done here, the same for local, containers and Modal.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .base import ClosingContext, ExecResult, SandboxError, SandboxStartError
from .command_gate import CommandGate
from .repo import GIT_IDENTITY
from .session import Session
from .supervisor_launch import STATE_DIR_IN_SANDBOX


STDERR_TAIL_BYTES = 4000


@dataclass
class Transport:
    """The supervisor's stdout, a way to write to (or, with None, close) its stdin, and why it ended."""

    reader: asyncio.StreamReader
    write: Callable[[bytes | None], Awaitable[None]]
    describe_end: Callable[[], Awaitable[str]]
    close: Callable[[], None] = lambda: None  # what the backend's teardown calls: both ends closed, if it has any


def process_transport(proc: asyncio.subprocess.Process, what: str) -> Transport:
    """The transport of a supervisor reached through a local process's pipes (bwrap; a container's `run` client).
    `what` names that process in the message that says how it ended."""

    async def write(data: bytes | None) -> None:
        if proc.stdin is None or proc.returncode is not None:
            raise BrokenPipeError(f"{what} is not running")
        if data is None:
            proc.stdin.close()
            return
        proc.stdin.write(data)
        await proc.stdin.drain()

    async def describe_end() -> str:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 5)
        err = b""
        if proc.stderr is not None:
            with contextlib.suppress(TimeoutError):
                err = await asyncio.wait_for(proc.stderr.read(STDERR_TAIL_BYTES * 4), 1)
        status = f"{what} still running" if proc.returncode is None else f"{what} exit status {proc.returncode}"
        tail = err.decode("utf-8", "replace").strip()[-STDERR_TAIL_BYTES:]
        return f"{status}; stderr: {tail}" if tail else status

    return Transport(proc.stdout, write, describe_end)  # type: ignore[arg-type]


async def pipe_transport(stdin_w: int, stdout_r: int, describe_end: Callable[[], Awaitable[str]]) -> Transport:
    """The transport of a supervisor reached through two pipe ends this process holds (a sandbox of the fork server):
    they are owned by the transport from here on, and closed with it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
    read_pipe = os.fdopen(stdout_r, "rb", buffering=0)
    try:
        write_pipe = os.fdopen(stdin_w, "wb", buffering=0)
    except BaseException:
        read_pipe.close()
        raise
    read_transport = None
    try:
        read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop),
                                                         read_pipe)
        writer_transport, writer_protocol = await loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(loop=loop), write_pipe)
    except BaseException:  # cancelled meanwhile: the supervisor reads end of file at once, not at the kill
        if read_transport is not None:
            read_transport.close()
        read_pipe.close()
        write_pipe.close()
        raise
    writer = asyncio.StreamWriter(writer_transport, writer_protocol, None, loop)

    async def write(data: bytes | None) -> None:
        if writer_transport.is_closing():
            raise BrokenPipeError("the supervisor's stdin is closed")
        if data is None:
            writer.close()
            return
        writer.write(data)
        await writer.drain()

    def close() -> None:
        writer_transport.close()
        read_transport.close()

    return Transport(reader, write, describe_end, close)


class SessionSandbox(ClosingContext):
    """A sandbox reached through its supervisor. Subclasses set `config`, `name`, `workdir`, `env_variables`."""

    state_dir = STATE_DIR_IN_SANDBOX
    extra_env: dict[str, str] = {}  # what a backend adds to every sandbox's first shell state
    command_gate: CommandGate | None = None  # set by a backend whose commands run on this machine's CPUs

    def __init__(self, config, env_variables: dict[str, str] | None, name: str):  # noqa: ANN001 - a backend config
        self.config = config
        self.workdir: str = config.workdir
        self.env_variables = dict(env_variables or {})
        self.name = name
        self.session: Session | None = None
        self._closed = False
        # Set by a backend whose launch gave the supervisor its first state (environment, working directory) and
        # whose commands need no probe (the fork server: the host's root and bash): the start skips both round trips.
        self.launched_ready = False

    # -- what a backend provides -------------------------------------------------------------------------------
    async def _launch(self) -> Transport:
        raise NotImplementedError

    async def _provision(self) -> None:
        """Put the task repository in place, after the supervisor is up (nothing to do where it is mounted)."""

    async def _teardown(self) -> None:
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} was closed")
        transport = await self._launch()
        session = Session(self.name, transport.reader, transport.write, transport.describe_end)
        await session.wait_ready(self.config.startup_timeout)
        self.session = session
        if not self.launched_ready:
            await session.write_file(f"{self.state_dir}/state.sh", self._first_state().encode(), append=True)
        await self._provision()
        if self.launched_ready:
            return
        probe = await self.exec("true", timeout=max(1.0, self.config.startup_timeout))
        if probe.exit_code != 0:
            raise SandboxStartError(f"sandbox {self.name} does not run commands: exit {probe.exit_code}: "
                                    f"{probe.output.strip()[-2000:]}")

    def first_environment(self) -> dict[str, str]:
        """What the first command's shell exports besides the supervisor's own environment."""
        return {**GIT_IDENTITY, **self.extra_env, **self.env_variables}

    def _first_state(self) -> str:
        """Appended to the supervisor's environment as the first command's shell state."""
        lines = [f"export {key}={shlex.quote(value)}" for key, value in self.first_environment().items()]
        return "\n".join([*lines, f"mkdir -p -- {shlex.quote(self.workdir)} 2>/dev/null",
                          f"cd -- {shlex.quote(self.workdir)}", ""])

    async def close(self) -> None:
        """End the sandbox and everything running in it. Safe twice, after a failed start, and while cancelled."""
        self._closed = True
        session, self.session = self.session, None
        if session is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(session.close())
        task = asyncio.ensure_future(self._teardown())
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(task)  # a second cancellation does not stop the teardown

    # -- commands ----------------------------------------------------------------------------------------------
    async def exec(
        self, command: str, timeout: float, *, stdin: bytes | None = None, merge_stderr: bool = True
    ) -> ExecResult:
        session = self.session
        if session is None:
            raise SandboxError(f"sandbox {self.name} is not running")
        timeout = min(timeout, self.config.runtime_timeout)
        if self.command_gate is None:
            return await session.run(command, timeout, stdin, merge_stderr)
        return await self.command_gate.run(lambda: session.run(command, timeout, stdin, merge_stderr))
