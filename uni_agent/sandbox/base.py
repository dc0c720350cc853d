"""What every sandbox backend offers: start, exec with a timeout, file transfer, close; and what every backend's
config has (DeploymentBase), whose `build()` makes the backend's sandbox.

Command failures are observations (an ExecResult with a non-zero exit code); infrastructure failures are
exceptions (SandboxError). File transfer is built on exec so that a backend only has to implement exec.

Each backend's config class sits beside its backend (LocalDeploymentConfig in local.py, ContainerDeploymentConfig in
container.py, ModalDeploymentConfig in modal.py, MemoryDeploymentConfig in memory.py); `type` picks it
(deployment_types.py's DEPLOYMENTS). This module imports no backend: each backend imports it.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict


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


class DeploymentBase(BaseModel):
    """What every sandbox backend's config has. A backend's config is a subclass that sets `type` and makes the
    backend's sandbox in `build`, registered in uni_agent.sandbox.deployment_types.DEPLOYMENTS (or named by its import
    path in `type`, which then is a plain `str` field)."""

    model_config = ConfigDict(extra="forbid")

    type: str
    """The backend: a name in DEPLOYMENTS, or the import path of its config class."""
    startup_timeout: float = 600
    """Seconds allowed for the sandbox to start (per attempt)."""
    runtime_timeout: float = 300
    """Upper bound on any single command in the sandbox."""
    deployment_timeout: float = 3600
    """Lifetime of the sandbox; the rollout is ended when it is reached."""
    start_retries: int = 3
    """Attempts at starting a sandbox before the rollout fails (transient errors only)."""

    def build(self, env_variables: dict[str, str], name: str = "") -> Sandbox:
        """This deployment's sandbox, not started, with these environment variables set in it; `name` goes into the
        sandbox's own name (its directory, its container)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how its sandbox is made (build)")


class ImageDeploymentBase(DeploymentBase):
    """A deployment whose sandboxes run a container image, through a provider the driver may reach via a proxy."""

    image: str | None = None
    """Container image (a registry reference, or for `local` also an OCI layout or archive: see image_store.py)."""
    proxy: str | None = None
    """Proxy for reaching the image registry or the sandbox provider."""


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
