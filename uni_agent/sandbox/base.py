"""What every sandbox backend offers: start, exec with a timeout, file transfer, close.

Command failures are observations (an ExecResult with a non-zero exit code); infrastructure failures are
exceptions (SandboxError). File transfer is built on exec so that a backend only has to implement exec.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start, died, transport broke); not a command that ran and failed."""


class SandboxStartError(SandboxError):
    """Starting the sandbox failed. Retried by the caller."""


@dataclass(frozen=True)
class ExecResult:
    stdout: bytes
    stderr: bytes
    exit_code: int | None  # None when the command was killed at its timeout
    timed_out: bool
    duration_s: float
    truncated_bytes: int = 0  # output past the capture cap, counted and dropped

    @property
    def output(self) -> str:
        """Stdout (and stderr, when the backend merged it) decoded safely: binary output never raises."""
        text = self.stdout.decode("utf-8", errors="replace")
        if self.stderr:
            text += self.stderr.decode("utf-8", errors="replace")
        return text


@runtime_checkable
class Sandbox(Protocol):
    workdir: str

    async def start(self) -> None: ...

    async def exec(
        self, command: str, timeout: float, *, stdin: bytes | None = None, merge_stderr: bool = True
    ) -> ExecResult: ...

    async def close(self) -> None: ...


class ClosingContext:
    """`async with sandbox:` starts it and closes it on every path, a failed start included (mixed into backends)."""

    async def start(self) -> None:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    async def __aenter__(self):  # noqa: ANN204 - returns the backend's own type
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def read_file(sandbox: Sandbox, path: str, timeout: float = 60) -> bytes:
    result = await sandbox.exec(f"cat -- {shlex.quote(path)}", timeout, merge_stderr=False)
    if result.exit_code != 0:
        raise FileNotFoundError(result.stderr.decode("utf-8", errors="replace").strip() or path)
    return result.stdout


async def write_file(sandbox: Sandbox, path: str, data: bytes, timeout: float = 60) -> None:
    # base64 over stdin keeps any byte sequence intact through the shell.
    quoted = shlex.quote(path)
    command = f"mkdir -p -- \"$(dirname -- {quoted})\" && base64 -d > {quoted}"
    result = await sandbox.exec(command, timeout, stdin=base64.b64encode(data), merge_stderr=False)
    if result.exit_code != 0:
        raise OSError(f"could not write {path}: {result.stderr.decode('utf-8', errors='replace').strip()}")


def clip_output(text: str, max_chars: int) -> str:
    """Keep the head and tail of long output and say how much was cut, so the model knows it saw a part."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    cut = len(text) - 2 * half
    return (
        text[:half]
        + f"\n<output clipped: {cut} characters omitted; narrow the command (e.g. head, tail, grep) to see more>\n"
        + text[-half:]
    )
