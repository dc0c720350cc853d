"""The OS side of an engine server: its process (started to die with the Dask worker, stopped with its whole
process group) and its port (chosen once, waited for after a crash)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path


def _die_with_parent(death_signal: int) -> Callable[[], None]:
    def set_death_signal() -> None:  # runs in the child, between fork and exec
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, death_signal)  # PR_SET_PDEATHSIG
    return set_death_signal


LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket


def listener_uid(port: int) -> int | None:
    """The uid that owns the socket listening on `port` (any address, IPv4 or IPv6), from /proc/net/tcp{,6}; None
    when nothing listens there. Another user may bind a port between our choosing it and our server binding it."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f, None)  # the header
            for line in f:
                fields = line.split()
                if fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return int(fields[7])
    return None


def free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def worker_host() -> str:
    try:
        from distributed import get_worker

        return get_worker().address.split("://")[-1].rsplit(":", 1)[0]
    except ValueError:
        return "127.0.0.1"


async def launch(command: list[str], log_path: str, env: dict[str, str],
                 death_signal: int = signal.SIGTERM) -> asyncio.subprocess.Process:
    """`command` as a child of this worker, in its own session, its output appended to `log_path`; when the worker
    dies the kernel sends it `death_signal`, and no one is left to follow that up (see ServerActor.DEATH_SIGNAL)."""
    Path(log_path).parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log_file:  # the child keeps its own copy of the descriptor
        return await asyncio.create_subprocess_exec(
            *command, stdout=log_file, stderr=log_file, preexec_fn=_die_with_parent(death_signal),
            env={**os.environ, **env}, start_new_session=True)


async def terminate(proc: asyncio.subprocess.Process | None) -> None:
    """SIGTERM to the server's process group, SIGKILL after 10 s; returns once it has exited (and been reaped)."""
    if proc is None:
        return
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def wait_until_bindable(host: str, port: int, timeout: float) -> None:
    """The crashed server's socket may linger a moment (its last children exiting): binding the port now would fail
    and spend a restart on nothing."""
    deadline = time.monotonic() + timeout
    while True:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind it
            try:
                sock.bind((host, port))
                return
            except OSError:
                if time.monotonic() > deadline:
                    return  # let the start fail and say why
        await asyncio.sleep(0.2)
