"""A stand-in for the data plane, not a sandbox: `uni-agent bench --simulate` measures the control plane with it.

Nothing runs and nothing is isolated. Starting takes `start_s`, every command takes `command_s` and prints the
configured `output` (the workspace-patch command prints nothing: the simulated agent changes no file), exit code 0.
Everything around it is the real path: the agent loop, tools, LLM client, actors, Dask, events, the page, Parquet.
Use it only to find out what the scheduler, driver, event stream and writer do with many rollouts in flight.
"""

from __future__ import annotations

import asyncio
from typing import Literal

from pydantic import Field

from .base import ClosingContext, DeploymentBase, ExecResult, SandboxError
from .start import PATCH_COMMAND  # answered with an empty diff


class MemoryDeploymentConfig(DeploymentBase):
    """Not a sandbox: a stand-in for the data plane in `uni-agent bench --simulate` (this module). Every command
    takes `command_s` seconds and returns `output`; nothing runs. For measuring the control plane."""

    type: Literal["memory"] = "memory"
    workdir: str = "/testbed"
    start_s: float = Field(default=0.0, ge=0)
    """Seconds a start takes."""
    command_s: float = Field(default=0.05, ge=0)
    """Seconds every command takes."""
    output: str = "ok\n"
    """What every command prints (the patch command prints nothing)."""

    def build(self, env_variables: dict[str, str], name: str = "") -> MemorySandbox:
        return MemorySandbox(self, env_variables, name=name)


class MemorySandbox(ClosingContext):
    def __init__(self, config: MemoryDeploymentConfig, env_variables: dict[str, str] | None = None, name: str = ""):
        self.config, self.name, self.workdir = config, name, config.workdir
        self._output = config.output.encode()
        self.running = False
        self.commands = 0

    async def start(self) -> None:
        if self.config.start_s:
            await asyncio.sleep(self.config.start_s)
        self.running = True

    async def exec(self, command: str, timeout: float, *, stdin: bytes | None = None,
                   merge_stderr: bool = True) -> ExecResult:
        if not self.running:
            raise SandboxError(f"sandbox {self.name} is not running")
        seconds = min(self.config.command_s, timeout)
        if seconds:
            await asyncio.sleep(seconds)
        self.commands += 1
        output = b"" if PATCH_COMMAND in command else self._output
        return ExecResult(output, b"", 0, False, seconds)

    async def close(self) -> None:
        self.running = False
