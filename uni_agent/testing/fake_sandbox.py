"""A test double for the agent loop's sandbox, not a sandbox: nothing runs and nothing is isolated.

Each command is answered by a Python function (`answer(command) -> Answer | str`), so that unit tests of the agent loop
(tests/test_agent_loop_unit.py) can script what the model's commands print, how long they take and whether they run
past their timeout, in milliseconds and without bubblewrap or containers. The workspace-patch command
(sandbox.start.workspace_patch) is answered with `patch`. Integration tests use the real sandboxes (uni_agent.sandbox);
the benchmark's stand-in for the data plane is sandbox/memory.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from ..config import AgentConfig
from ..sandbox import ExecResult, Sandbox, SandboxError
from ..sandbox.start import PATCH_COMMAND


@dataclass(frozen=True)
class Answer:
    """What a command prints and how it ends. A command taking longer than its timeout is killed at the timeout,
    as a real sandbox does: the result says timed_out and carries no exit code."""

    output: str = ""
    exit_code: int = 0
    seconds: float = 0.0


def _silent(command: str) -> Answer:
    return Answer()


class FakeSandbox:
    workdir = "/workspace"

    def __init__(self, answer: Callable[[str], Answer | str] = _silent, *, patch: str = "", name: str = "",
                 start_s: float = 0.0):
        self.answer, self.patch, self.name, self.start_s = answer, patch, name, start_s
        self.commands: list[str] = []  # every command run, the patch command included, in order
        self.started = self.closed = False

    async def start(self) -> None:
        if self.start_s:  # a slow start (a wave's start burst), so that tests can act while it is in flight
            await asyncio.sleep(self.start_s)
        self.started = True

    async def exec(self, command: str, timeout: float, *, stdin: bytes | None = None,
                   merge_stderr: bool = True) -> ExecResult:
        if not self.started or self.closed:
            raise SandboxError(f"sandbox {self.name} is not running")
        self.commands.append(command)
        if PATCH_COMMAND in command:
            return ExecResult(self.patch.encode(), b"", 0, False, 0.0)
        answer = self.answer(command)
        if isinstance(answer, str):
            answer = Answer(answer)
        if answer.seconds > timeout:
            await asyncio.sleep(timeout)
            return ExecResult(answer.output.encode(), b"", None, True, timeout)
        if answer.seconds:
            await asyncio.sleep(answer.seconds)
        return ExecResult(answer.output.encode(), b"", answer.exit_code, False, answer.seconds)

    async def close(self) -> None:
        self.closed = True


def opener(sandbox: FakeSandbox) -> Callable[[AgentConfig, str], Awaitable[Sandbox]]:
    """A sandbox opener (the agent loop's `open_sandbox`) that names, starts and hands out `sandbox`."""

    async def open_sandbox(agent: AgentConfig, name: str) -> Sandbox:
        sandbox.name = name
        await sandbox.start()
        return sandbox

    return open_sandbox
