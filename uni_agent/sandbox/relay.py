"""The host's end of the relay: connections made inside a sandbox, carried over its supervisor's channel to the host.

A program in a sandbox whose network is off can still reach one thing on the host: the supervisor listens on
127.0.0.1:PORT inside (Session.listen), and each connection a program makes there arrives here as `open`, then
`data` and `close` messages on the supervisor's stdout (the protocol is in supervisor.py's docstring). For each one
this module opens a stream to the listener's target (`connect()`, e.g. the model gateway's socket) and copies bytes
both ways. It rides the channel every backend already has, so it works the same on local, image, container and
Modal sandboxes, and adds no route out of the sandbox: only the targets the host chose are reachable.

Bytes from the program wait in a queue per connection until its target takes them, so a slow target never holds
up the supervisor's stream (command results and other connections share it). The queue is capped
(INBOX_LIMIT_BYTES): a program that sends faster than its target takes, for long, loses that connection instead of
growing the worker's memory, which every sandbox on the worker shares.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog

from .base import SandboxError

log = structlog.get_logger("uni_agent.sandbox")

READ_CHUNK = 65536
INBOX_LIMIT_BYTES = 32 * 1024 * 1024  # per connection: far above a model request (a 128k-token context is ~1 MB)
Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


def tcp_target(host: str, port: int) -> Connect:
    """Relayed connections go to host:port on this machine."""
    return lambda: asyncio.open_connection(host, port)


def unix_target(path: str) -> Connect:
    """Relayed connections go to a Unix socket on this machine (private to its owner: no other local user's way in)."""
    return lambda: asyncio.open_unix_connection(path)


class Relay:
    """A session's relayed connections, by the supervisor's connection id. `send` puts one whole message on the
    supervisor's stdin; `targets` maps each listening port in the sandbox to what its connections are joined to."""

    def __init__(self, name: str, send: Callable[[bytes], Awaitable[None]]):
        self.name = name
        self._send = send
        self.targets: dict[int, Connect] = {}
        self._inboxes: dict[int, asyncio.Queue[bytes | None]] = {}
        self._queued: dict[int, int] = {}  # bytes waiting in each inbox
        self._writers: dict[int, asyncio.StreamWriter] = {}  # to each connection's target, once connected
        self._tasks: dict[int, asyncio.Task] = {}
        self.connections = 0  # every connection relayed so far

    def opened(self, conn_id: int, port: int) -> None:
        inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._inboxes[conn_id] = inbox
        self._tasks[conn_id] = asyncio.ensure_future(self._carry(conn_id, port, inbox))
        self.connections += 1

    def received(self, conn_id: int, data: bytes) -> None:
        inbox = self._inboxes.get(conn_id)
        if inbox is None:  # its target is gone: dropped, as the protocol says
            return
        self._queued[conn_id] = queued = self._queued.get(conn_id, 0) + len(data)
        if queued > INBOX_LIMIT_BYTES:
            log.warning("relay_connection_over_limit", sandbox=self.name, connection=conn_id, queued_bytes=queued,
                        detail="the program sent faster than its target took; the connection is ended")
            del self._inboxes[conn_id]  # what else arrives for it is dropped
            writer = self._writers.get(conn_id)
            if writer is not None:  # at once, unsent bytes dropped: close() would wait for the target to read them
                writer.transport.abort()  # the read loop sees the end and tells the program
            inbox.put_nowait(None)
            return
        inbox.put_nowait(data)

    def closed(self, conn_id: int) -> None:
        inbox = self._inboxes.get(conn_id)
        if inbox is not None:
            inbox.put_nowait(None)

    async def close(self) -> None:
        """End every relayed connection (the session is closing or its supervisor is gone)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task

    async def _carry(self, conn_id: int, port: int, inbox: asyncio.Queue[bytes | None]) -> None:
        writer: asyncio.StreamWriter | None = None
        to_target: asyncio.Task | None = None
        try:
            connect = self.targets.get(port)
            if connect is None:
                raise OSError(f"nothing on the host is joined to port {port}")
            reader, writer = await connect()
            self._writers[conn_id] = writer
            to_target = asyncio.ensure_future(self._forward(conn_id, inbox, writer))
            while chunk := await reader.read(READ_CHUNK):
                await self._send(b"data %d %d\n" % (conn_id, len(chunk)) + chunk)
            await self._send(b"close %d\n" % conn_id)  # the target is done; the program may still send
            await to_target
        except (OSError, SandboxError) as exc:  # the program sees its connection end; nothing else is affected
            log.debug("relay_connection_failed", sandbox=self.name, connection=conn_id,
                      error=f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(OSError, SandboxError):
                await self._send(b"close %d\n" % conn_id)
        finally:
            if to_target is not None:
                to_target.cancel()
            if writer is not None:
                writer.close()
            self._writers.pop(conn_id, None)
            self._inboxes.pop(conn_id, None)
            self._queued.pop(conn_id, None)
            self._tasks.pop(conn_id, None)

    async def _forward(self, conn_id: int, inbox: asyncio.Queue[bytes | None], writer: asyncio.StreamWriter) -> None:
        """The program's bytes to the target, until the program closes its side (then half-close the target's)."""
        while (chunk := await inbox.get()) is not None:
            self._queued[conn_id] -= len(chunk)
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
