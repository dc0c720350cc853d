"""A Dask actor that owns one LLM server subprocess: start it, wait until it answers, publish its URL, stop it.

Dask worker processes are daemonic and cannot fork multiprocessing children, so the server is a plain subprocess.
It is started from the worker's event loop thread (an async method), which lives as long as the worker, and gets
PR_SET_PDEATHSIG so that it dies with the worker instead of leaking.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import time
from pathlib import Path

import httpx


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


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


class ServerActor:
    """Subclasses give `command(host, port)`; the actor handles the process and its health."""

    def __init__(self, name: str, log_path: str, env: dict[str, str] | None = None):
        self.name = name
        self.log_path = log_path
        self.env = env or {}
        self.url: str | None = None
        self._proc: asyncio.subprocess.Process | None = None

    def command(self, host: str, port: int) -> list[str]:
        raise NotImplementedError

    async def start(self, timeout: float) -> str:
        host = worker_host()
        port = free_port(host)
        Path(self.log_path).parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self._proc = await asyncio.create_subprocess_exec(
                *self.command(host, port), stdout=log, stderr=log, preexec_fn=_die_with_parent,
                env={**os.environ, **self.env}, start_new_session=True,
            )
        finally:
            log.close()
        self.url = f"http://{host}:{port}/v1"
        await self._wait_ready(timeout)
        return self.url

    async def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5) as http:
            while time.monotonic() < deadline:
                if self._proc is not None and self._proc.returncode is not None:
                    raise RuntimeError(f"{self.name} exited with {self._proc.returncode}; see {self.log_path}:\n"
                                       + self.log_tail())
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{self.url}/models")).status_code == 200:
                        return
                await asyncio.sleep(0.5)
        await self.stop()
        raise TimeoutError(f"{self.name} did not answer at {self.url} within {timeout:g}s; see {self.log_path}")

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError):
            return Path(self.log_path).read_text(errors="replace")[-chars:]
        return ""

    async def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
