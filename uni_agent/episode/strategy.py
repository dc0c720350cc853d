"""The agent protocol: what an agent strategy is given for one episode (Episode: the sandbox, the model, the budget)
and what it returns (an Ending). Everything around the acting (the row begun, the deadline, the sandbox started and
set up, endings that are exceptions, the patch, the close, redaction, classification, masks) is the envelope's
(envelope.py), the same for every strategy.

Two strategies ship: our own loop (agent_loop.UniAgentLoop) and a program that brings its own loop
(uni_agent.harness.HarnessAgent). The agent config names its strategy (`_target_`, our loop when it names none);
agent_loop.strategy_for builds it from that config alone, a fresh one per rollout (a strategy keeps its rollout's
conversation or calls).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ..config import AgentConfig, EnvConfig
from ..llm import ChatReply, TokenContext
from ..sandbox import Sandbox, SandboxError

if TYPE_CHECKING:
    from .ending import Ending
    from .rollout import RolloutResult, RolloutSpec


class ChatModel(Protocol):
    """What a strategy asks of its model: a ChatClient, or the agent worker's RolloutSession (which moves a rollout
    to another engine replica when its own is down)."""

    model: str  # the served model's name

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                   response_format: dict[str, Any] | None = None, context: TokenContext | None = None
                   ) -> ChatReply: ...


@dataclass(frozen=True)
class Budget:
    """The episode's wall clock: it must end by `deadline` (time.monotonic()), `seconds` after it began."""

    deadline: float
    seconds: float

    def left(self) -> float:
        return max(self.deadline - time.monotonic(), 0.0)


class SandboxStart:
    """The episode's sandbox as a strategy gets it: `started` is its start, still in flight when the strategy
    begins (a first model call needs no sandbox, so it may overlap the start); `ready()` is the started sandbox with
    the agent's post_setup_cmd run (once)."""

    def __init__(self, started: asyncio.Task[Sandbox], env: EnvConfig):
        self.started = started
        self._env = env
        self._setup: asyncio.Future[None] | None = None

    async def ready(self) -> Sandbox:
        sandbox = await self.started
        if self._setup is None:
            self._setup = asyncio.ensure_future(self._post_setup(sandbox))
        await self._setup
        return sandbox

    async def _post_setup(self, sandbox: Sandbox) -> None:
        if self._env.post_setup_cmd:
            setup = await sandbox.exec(self._env.post_setup_cmd, self._env.deployment.runtime_timeout)
            if setup.exit_code != 0:
                raise SandboxError(f"post_setup_cmd failed (exit {setup.exit_code}): {setup.output[-1000:]}")


@dataclass
class Episode:
    """What a strategy gets for one rollout."""

    spec: RolloutSpec
    model: ChatModel
    sandbox: SandboxStart
    budget: Budget
    row: RolloutResult  # the counters it keeps as it goes (num_turns, tokens, llm_s, tools_s): kept on every path
    state: Callable[..., None]  # state(RolloutState.RUNNING, turn=k, max_turns=n): the rollout's progress events
    log: Any  # structlog, bound to the rollout


@runtime_checkable
class AgentStrategy(Protocol):
    """One rollout's acting part, built as `Strategy(agent_config)`."""

    grace_s: float
    """How long past the deadline the envelope waits for `act` to return: 0 for a strategy the envelope stops at
    the deadline, more for one that stops its own program there and reports how (the harness)."""

    def sandbox_config(self) -> AgentConfig:
        """The config its sandbox is opened with (the harness adds its read-only mounts); a SandboxError if none
        can be."""

    def time_limit(self) -> float | None:
        """Its own wall-clock bound, beside interaction.episode_timeout and the deployment's (None: none)."""

    async def act(self, episode: Episode) -> Ending:
        """Act until the episode ends; how it ended. Failures of the model endpoint (LLMError), of the sandbox
        (SandboxError, OSError) and EpisodeEnd may be raised: the envelope turns them into Endings."""

    def record(self, row: RolloutResult) -> None:
        """Its transcript into the row: messages and token columns. Called once on every path, after the sandbox
        closed, before redaction."""
