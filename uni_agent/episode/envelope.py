"""The episode envelope: one rollout around an agent strategy (strategy.py), the same for our loop and any harness.
Reads top to bottom.

the row begun → the deadline (interaction.episode_timeout, the sandbox's deployment_timeout, the strategy's own) →
the sandbox starting (retried) → the strategy acts until it returns an Ending, or an exception or the wall clock
ends it (each made an Ending here) → patch = git diff, graded in this sandbox when the reward says so → sandbox
closed → the strategy's transcript → redaction → classification (failures.py) → mask → the row.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Any

import structlog

from ..config import AgentConfig
from ..events import Emit, RolloutState, no_emit, rollout_event
from ..llm import ContextLimitError, LLMError
from ..llm.outage import engine_outage_s
from ..redact import redact
from ..sandbox import Sandbox, SandboxError
from ..sandbox.start import start_sandbox, workspace_patch
from .ending import Ending, EpisodeEnd, infra_failure
from .exit_reason import ExitReason
from .failures import FailedPart, classify
from .rollout import RolloutResult, RolloutSpec
from .strategy import AgentStrategy, Budget, ChatModel, Episode, SandboxStart

if TYPE_CHECKING:
    from ..verification import Verification

log = structlog.get_logger("uni_agent.agent")

SandboxOpener = Callable[[AgentConfig, str], Awaitable[Sandbox]]  # (agent, sandbox name) -> a started sandbox
SandboxGrader = Callable[[Sandbox, AgentConfig], Awaitable["Verification"]]  # grading in the agent's own sandbox

# Who closes an episode's sandbox once its patch (and in-sandbox grade) is taken. Unset, the episode awaits the close
# itself: the sandbox is gone when the result returns. An agent worker sets it for its rollouts and closes them in the
# background (awaited at its own close): ending a sandbox (its processes, its pid namespace, its dir) took 0.1-0.4 s
# at the median under load, time the result does not depend on.
sandbox_closer: ContextVar[Callable[[Sandbox], None] | None] = ContextVar("sandbox_closer", default=None)


async def run_episode(strategy: AgentStrategy, spec: RolloutSpec, model: ChatModel, *, emit: Emit = no_emit,
                      worker: str = "", open_sandbox: SandboxOpener = start_sandbox,
                      grade_in_sandbox: SandboxGrader | None = None) -> RolloutResult:
    """One rollout of `spec` acted by `strategy` with `model`: its row. `grade_in_sandbox` grades in the agent's own
    sandbox before it closes (spec.grade_in_agent_sandbox: Terminal-Bench); other grading runs afterwards."""
    if spec.grade_in_agent_sandbox and grade_in_sandbox is None:
        raise ValueError(f"{spec.instance_id}: the reward is graded in the agent's sandbox, but the episode was "
                         "given no grade_in_sandbox")
    agent = spec.agent
    row = RolloutResult.begin(spec, agent.name, worker)
    bound = log.bind(run_id=spec.run_id, instance_id=spec.instance_id, rollout=spec.rollout)
    started = time.monotonic()
    limits = [strategy.time_limit(), agent.interaction.episode_timeout, agent.env.deployment.deployment_timeout]
    seconds = min((x for x in limits if x), default=float("inf"))
    budget = Budget(started + seconds, seconds)
    state = partial(_state, emit, spec, worker)
    state(RolloutState.STARTING_SANDBOX)
    sandbox = SandboxStart(asyncio.ensure_future(_open(strategy, open_sandbox, spec, row, bound)), agent.env)
    try:
        ending = await _act(strategy, Episode(spec, model, sandbox, budget, row, state, bound), strategy.grace_s)
        row.end(blamed_on_outage(ending, row.started_at))
    finally:
        opened = await started_or_stopped(sandbox.started)
        if opened is not None:
            grade = grade_in_sandbox if spec.grade_in_agent_sandbox else None
            await collect_patch_and_close(opened, row, agent, grade, lambda: state(RolloutState.VERIFYING))
    _settle(strategy, row, agent)
    row.total_s = time.monotonic() - started
    row.finished_at = time.time()
    bound.info("rollout_finished", exit_reason=row.exit_reason.value, turns=row.num_turns, error=row.error)
    return row


async def _act(strategy: AgentStrategy, episode: Episode, grace_s: float) -> Ending:
    """The strategy's Ending, or the one an exception or the wall clock makes."""
    try:
        return await _within_wall_clock(strategy.act(episode), episode.budget, grace_s)
    except EpisodeEnd as end:
        return end.ending
    except ContextLimitError as exc:
        return Ending(ExitReason.CONTEXT_LIMIT, str(exc))
    except LLMError as exc:  # transport errors and 429/5xx after retries, or an unusable answer
        return infra_failure(FailedPart.LLM, exc)
    except (SandboxError, OSError) as exc:
        return infra_failure(FailedPart.SANDBOX, exc)


def blamed_on_outage(ending: Ending, started_at: float) -> Ending:
    """A wall-clock end whose clock ran while no engine could answer (a lost engine waited for) is the outage's, not
    the model's: exit reason engine_down, an llm failure. Judged here, in the worker whose clients saw the outage
    (uni_agent.llm.outage), and only once: a row graded later in another process keeps it."""
    if ending.reason != ExitReason.WALL_CLOCK or (down_s := engine_outage_s(started_at)) <= 0:
        return ending
    return Ending(ExitReason.ENGINE_DOWN, f"every engine was down for {down_s:.0f} s of this episode, which then ran "
                                          f"past its wall-clock budget ({ending.error})", FailedPart.LLM)


async def _within_wall_clock(acting: Awaitable[Ending], budget: Budget, grace_s: float) -> Ending:
    """`acting`, stopped `grace_s` past the budget's deadline: then WALL_CLOCK."""
    try:
        async with asyncio.timeout(budget.left() + grace_s if budget.seconds != float("inf") else None):
            return await acting
    except TimeoutError:  # an OSError too: ended here, so it is not taken for the sandbox's
        raise EpisodeEnd(Ending(ExitReason.WALL_CLOCK,
                                f"the episode ran past its wall-clock budget of {budget.seconds:g} s")) from None


async def _open(strategy: AgentStrategy, open_sandbox: SandboxOpener, spec: RolloutSpec, row: RolloutResult,
                bound: Any) -> Sandbox:
    """The rollout's sandbox, started (with the opener's retries); sandbox_start_s is how long the episode waited for
    it: the start alone, or what was left of a start begun while the engines started (uni_agent.episode.worker)."""
    t0 = time.monotonic()
    sandbox = await open_sandbox(strategy.sandbox_config(), sandbox_name(spec))
    row.sandbox_start_s = time.monotonic() - t0
    bound.info("sandbox_started", seconds=round(row.sandbox_start_s, 3))
    return sandbox


def sandbox_name(spec: RolloutSpec) -> str:
    return f"{spec.instance_id}-r{spec.rollout}"


async def collect_patch_and_close(sandbox: Sandbox, row: RolloutResult, agent: AgentConfig,
                                  grade: SandboxGrader | None, on_grading: Callable[[], None]) -> None:
    """The end of every episode, whatever ended it: the workspace's patch kept (a max_turns or timeout rollout is
    still graded), graded in this sandbox when `grade` is given (the tests see the machine as the agent left it), and
    the sandbox closed on every path (or handed to `sandbox_closer`, where one is set)."""
    try:
        row.patch = await workspace_patch(sandbox)
    except (SandboxError, OSError) as exc:
        if row.error is None:
            row.end(infra_failure(FailedPart.SANDBOX, f"could not collect the patch: {exc}"))
    try:
        if grade is not None:
            on_grading()
            row.record(await grade(sandbox, agent))
    finally:
        closer = sandbox_closer.get()
        if closer is None:
            await sandbox.close()
        else:
            closer(sandbox)


def _settle(strategy: AgentStrategy, row: RolloutResult, agent: AgentConfig) -> None:
    """The row once the sandbox is closed: the transcript, secrets out, whose failure it is, the mask."""
    strategy.record(row)
    row.messages = _redacted(row.messages)
    if row.error is not None:  # an endpoint's error body may echo the request's credentials
        row.error = redact(row.error)
    classify(row)  # settled again when the driver's verification is recorded (RolloutResult.record)
    if row.failure_cause is not None:
        row.failure_cause = redact(row.failure_cause)
    if agent.mask_abnormal_exit_traj and row.exit_reason != ExitReason.SUBMITTED:
        # the seed's meaning: a rollout that did not end with `submit` is not trained on
        row.mask(f"mask_abnormal_exit_traj: exit_reason {row.exit_reason.value}")


def _redacted(value: Any) -> Any:
    """`value` (messages: lists, dicts, strings) with every string redacted."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, list):
        return [_redacted(v) for v in value]
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    return value


def _state(emit: Emit, spec: RolloutSpec, worker: str, state: RolloutState, **fields: Any) -> None:
    emit(rollout_event(spec.run_id, spec.instance_id, spec.rollout, state, worker=worker, **fields))


async def started_or_stopped(starting: asyncio.Task[Sandbox]) -> Sandbox | None:
    """The started sandbox, or None: a start still in flight is cancelled (start_sandbox closes what it had begun),
    and one that finished as it was cancelled is returned, to be closed like any other."""
    if not starting.done():
        starting.cancel()
        await asyncio.wait({starting})
    if starting.cancelled() or starting.exception() is not None:  # its error, if any, was the episode's ending
        return None
    return starting.result()
