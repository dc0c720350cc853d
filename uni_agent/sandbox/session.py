"""The host's half of the sandbox session: it talks to the supervisor (supervisor.py) running inside a sandbox.

Every backend starts the supervisor its own way (local: inside bubblewrap; podman/docker: as the container's main
process; Modal: one long-lived exec) and hands this module the two ends of its stdin/stdout. From there, commands,
timeouts, cancellation and a supervisor that dies are handled here, once for every backend:
- one command at a time per sandbox (they share the shell state);
- a command past its timeout is killed by the supervisor inside the sandbox; the host waits a grace period longer,
  then asks for a cancel, then gives up on the session (SandboxError) rather than hang;
- a caller cancelled mid-command (the rollout's wall clock, a closing worker) cancels the command in the sandbox
  and leaves the session usable;
- the supervisor's stream ending is a SandboxError that says how it ended (its exit status and stderr tail).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import structlog

from .base import ExecResult, SandboxError, SandboxStartError
from .relay import Connect, Relay
from .supervisor_launch import NO_PYTHON, STATE_DIR_IN_SANDBOX

log = structlog.get_logger("uni_agent.sandbox")

HOST_GRACE_S = 5.0  # how long past a command's timeout the host waits for the supervisor's own kill to answer
CANCEL_WAIT_S = 10.0  # how long a cancelled command may take to be reported before the session counts as broken
READY_LINE_LIMIT = 1 << 20


class ImageWithoutPython(SandboxError):
    """The sandbox's image has no python3 for the supervisor: a start that is not retried (the image will not
    change). Raised where the supervisor's stream ends with the launcher's NO_PYTHON line (supervisor_launch.py)."""


class Session:
    """A live connection to one sandbox's supervisor.

    `reader` yields the supervisor's stdout, `write` sends bytes to its stdin (and `write(None)` closes it), and
    `describe_end` says, once the stream has ended, why (exit status, stderr tail) for the error message. Once the
    supervisor is ready, one task reads everything it sends: the answer to each request goes to its caller, and the
    relay's stream messages to their connections (relay.py), so a relayed connection never waits for a command."""

    def __init__(self, name: str, reader: asyncio.StreamReader, write: Callable[[bytes | None], Awaitable[None]],
                 describe_end: Callable[[], Awaitable[str]]):
        self.name = name
        self._reader = reader
        self._write = write
        self._describe_end = describe_end
        self._lock = asyncio.Lock()  # one request at a time (commands share the shell state)
        self._write_lock = asyncio.Lock()  # one message at a time on the stream (requests and relayed bytes)
        self._ids = itertools.count(1)
        self._broken: str | None = None
        self._gone: str | None = None  # why the supervisor's stream ended, once it has
        self._answers: dict[int, asyncio.Future] = {}
        self._pump: asyncio.Task | None = None
        self._running: int | None = None  # the request the supervisor is carrying out now
        self.relay = Relay(name, self._send_message)
        self.supervisor_pid: int | None = None
        self.python_version = ""

    async def wait_ready(self, timeout: float) -> None:
        try:
            fields = await asyncio.wait_for(self._read_header(), timeout)
        except TimeoutError:
            raise SandboxStartError(f"sandbox {self.name}: the supervisor did not start within {timeout:g}s") from None
        except ImageWithoutPython:
            raise  # the image will not change: no point in retrying the start
        except SandboxError as exc:
            raise SandboxStartError(str(exc)) from None
        if fields[0] != "ready" or len(fields) != 3:
            raise SandboxStartError(f"sandbox {self.name}: the supervisor said {' '.join(fields)!r}, not ready")
        self.supervisor_pid, self.python_version = int(fields[1]), fields[2]
        self._pump = asyncio.ensure_future(self._read_messages())

    async def run(self, command: str, timeout: float, stdin: bytes | None, merge_stderr: bool) -> ExecResult:
        encoded = command.encode()
        fields = f"{timeout:.3f} {int(merge_stderr)} {len(encoded)} {-1 if stdin is None else len(stdin)}"
        return await self._call("exec", fields, encoded + (stdin or b""), timeout + HOST_GRACE_S)

    async def write_file(self, path: str, data: bytes, append: bool = False, timeout: float = 60) -> None:
        encoded = path.encode()
        await self._call("write", f"{int(append)} {len(encoded)} {len(data)}", encoded + data, timeout)

    async def listen(self, connect: Connect, port: int = 0, timeout: float = 30) -> int:
        """Listen on 127.0.0.1:`port` inside the sandbox (0: a free port) and join every connection made there to a
        stream that `connect()` opens on this side (the model gateway, say). Returns the port. Needs no network in
        the sandbox: the bytes travel on the supervisor's own channel, next to the commands."""
        request_id = next(self._ids)
        answer = self._expect(request_id)
        try:
            await self._send_message(f"listen {request_id} {port}\n".encode())
            bound = await asyncio.wait_for(asyncio.shield(answer), timeout)
        except TimeoutError:
            raise SandboxError(f"sandbox {self.name}: the supervisor did not answer `listen` within {timeout:g}s"
                               ) from None
        finally:
            self._answers.pop(request_id, None)
        self.relay.targets[bound] = connect
        return bound

    async def interrupt(self) -> None:
        """Kill the running command's process group, as its timeout would; its caller gets its result (timed_out)
        with the output so far. Nothing happens when no command runs."""
        if self._running is not None and self._gone is None:
            await self._send_message(f"cancel {self._running}\n".encode())

    async def close(self) -> None:
        """Close the supervisor's stdin: it kills every process group it started and exits."""
        self._broken = self._broken or "closed"
        with contextlib.suppress(Exception):
            await self._write(None)
        await self.relay.close()
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump

    # -- one request -------------------------------------------------------------------------------------------
    async def _call(self, op: str, fields: str, payload: bytes, wait_s: float) -> ExecResult:
        async with self._lock:
            self._check_usable()
            request_id = next(self._ids)
            answer = self._expect(request_id)
            started = time.monotonic()
            self._running = request_id
            try:
                await self._send_message(f"{op} {request_id} {fields}\n".encode() + payload)
                try:
                    result = await asyncio.wait_for(asyncio.shield(answer), wait_s)
                except TimeoutError:
                    result = await self._cancel(request_id, answer, "did not answer within its timeout")
                except asyncio.CancelledError:
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._cancel(request_id, answer, "was cancelled"))
                    raise
            finally:
                self._answers.pop(request_id, None)
                self._running = None
            return replace(result, duration_s=time.monotonic() - started)

    def _check_usable(self) -> None:
        if self._gone is not None:
            raise SandboxError(f"sandbox {self.name} is gone: {self._gone}")
        if self._broken is not None:
            raise SandboxError(f"sandbox {self.name} is not usable: {self._broken}")
        if self._pump is None:
            raise SandboxError(f"sandbox {self.name}: the supervisor is not ready")

    def _expect(self, request_id: int) -> asyncio.Future:
        answer = asyncio.get_running_loop().create_future()
        if self._gone is not None:
            answer.set_exception(SandboxError(f"sandbox {self.name} is gone: {self._gone}"))
        self._answers[request_id] = answer
        return answer

    async def _cancel(self, request_id: int, answer: asyncio.Future, why: str) -> ExecResult:
        try:
            await self._send_message(f"cancel {request_id}\n".encode())
            return await asyncio.wait_for(asyncio.shield(answer), CANCEL_WAIT_S)
        except (TimeoutError, SandboxError) as exc:
            if isinstance(exc, SandboxError) and self._gone is not None:
                raise
            self._broken = f"command {request_id} {why} and its cancel was not answered"
            raise SandboxError(f"sandbox {self.name}: {self._broken}") from exc

    async def _send_message(self, data: bytes) -> None:
        """One whole message onto the supervisor's stdin. A cancel while it is being written leaves the stream out
        of step for good: the session is then marked unusable (a clear error, never a garbled request)."""
        async with self._write_lock:
            if self._gone is not None:
                raise SandboxError(f"sandbox {self.name} is gone: {self._gone}")
            try:
                await self._write(data)
            except asyncio.CancelledError:
                self._broken = self._broken or f"a message was cancelled while it was being sent: {data[:40]!r}"
                raise
            except (BrokenPipeError, ConnectionResetError, OSError) as exc:
                # ended as the reading side ends (_fail, which says how the sandbox ended): which of the two notices
                # the end first is a race
                await self._fail(f"could not reach the supervisor ({type(exc).__name__})")

    # -- what the supervisor sends ------------------------------------------------------------------------------
    async def _read_messages(self) -> None:
        try:
            while True:
                fields = await self._read_header()
                op = fields[0]
                if op == "result" and len(fields) == 9:
                    self._answer(int(fields[1]), await self._read_result(fields))
                elif op == "failed" and len(fields) == 3:
                    message = (await self._read_exactly(int(fields[2]))).decode("utf-8", "replace")
                    self._answer(int(fields[1]), SandboxError(f"sandbox {self.name}: {message}"))
                elif op == "listening" and len(fields) == 3:
                    self._answer(int(fields[1]), int(fields[2]))
                elif op == "data" and len(fields) == 3:
                    self.relay.received(int(fields[1]), await self._read_exactly(int(fields[2])))
                elif op == "open" and len(fields) == 3:
                    self.relay.opened(int(fields[1]), int(fields[2]))
                elif op == "close" and len(fields) == 2:
                    self.relay.closed(int(fields[1]))
                else:
                    await self._fail(f"protocol out of step: the supervisor sent {' '.join(fields)[:200]!r}")
        except SandboxError as exc:
            gone = str(exc).split(" is gone: ", 1)[-1]
            self._gone = gone
            for answer in self._answers.values():
                if not answer.done():
                    answer.set_exception(SandboxError(f"sandbox {self.name} is gone: {gone}"))
            await self.relay.close()

    def _answer(self, request_id: int, value: object) -> None:
        answer = self._answers.get(request_id)
        if answer is None or answer.done():
            return  # its caller gave up on it (the session was marked unusable then)
        if isinstance(value, BaseException):
            answer.set_exception(value)
        else:
            answer.set_result(value)

    async def _read_result(self, fields: list[str]) -> ExecResult:
        _, _, exit_code, timed_out, cancelled, out_size, err_size, dropped, _seconds = fields
        body = await self._read_exactly(int(out_size) + int(err_size))
        return ExecResult(
            stdout=body[:int(out_size)],
            stderr=body[int(out_size):],
            exit_code=None if exit_code == "-" else int(exit_code),
            timed_out=timed_out == "1" or cancelled == "1",
            duration_s=0.0,
            truncated_bytes=int(dropped),
        )

    async def _read_exactly(self, size: int) -> bytes:
        try:
            return await self._reader.readexactly(size)
        except asyncio.IncompleteReadError:
            await self._fail("the supervisor's output ended mid-message")
            raise AssertionError("unreachable") from None

    async def _read_header(self) -> list[str]:
        try:
            line = await self._reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:
            await self._fail("the supervisor exited")
        except asyncio.LimitOverrunError:
            await self._fail("the supervisor sent a header line that is too long")
        fields = line.decode("utf-8", "replace").split()
        if not fields:
            await self._fail(f"the supervisor sent something that is not a message: {line[:200]!r}")
        return fields

    async def _fail(self, what: str) -> None:
        ended = ""
        if self._broken is None or self._broken == "closed":
            with contextlib.suppress(Exception):
                ended = await asyncio.wait_for(self._describe_end(), 5)
                what += f" ({ended})"
        # the launcher's only channel is its stderr: its line becomes a type here, once
        kind = ImageWithoutPython if NO_PYTHON in ended else SandboxError
        raise kind(f"sandbox {self.name} is gone: {what}")


def reader_from_chunks(chunks: AsyncIterator[bytes | str]) -> tuple[asyncio.StreamReader, asyncio.Task]:
    """A StreamReader fed from an async iterator of chunks (the Modal SDK's process output), and its pump task."""
    reader = asyncio.StreamReader(limit=READY_LINE_LIMIT)

    async def pump() -> None:
        try:
            async for chunk in chunks:
                reader.feed_data(chunk.encode() if isinstance(chunk, str) else chunk)
        except Exception as exc:  # the transport broke: the session sees the end of its stream
            log.warning("sandbox_stream_broke", error=f"{type(exc).__name__}: {exc}")
        finally:
            reader.feed_eof()

    return reader, asyncio.ensure_future(pump())
