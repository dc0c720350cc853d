"""Verification entry points: grade an answer in a fresh sandbox (`verify_patch`, `verify_reference`), or in the
agent's own sandbox as it was left (`grade_in_sandbox`, handed to the agent loop as a hook when
reward.in_agent_sandbox).

They are coroutines: the driver submits them to Dask, and distributed runs a coroutine function on the worker's event
loop, next to the agent loops (no thread, no second event loop). The row's `reward.name` picks the grader
(grader_names.py); its time limit bounds the grading, and every failure becomes the Verification's status and error.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Literal

from ..sandbox.start import start_sandbox
from ..verification import Verification, VerificationStatus
from .grader_names import grader_for

if TYPE_CHECKING:
    from ..config import AgentConfig
    from ..sandbox import Sandbox

ReferenceKind = Literal["gold", "empty", "oracle"]


async def verify_patch(agent: AgentConfig, patch: str, name: str = "verify") -> Verification:
    """Grade `patch` in a fresh sandbox (started here, closed here)."""
    return await _verify_in_fresh_sandbox(agent, patch, name, oracle=False)


async def verify_reference(agent: AgentConfig, kind: ReferenceKind, name: str = "verify") -> Verification:
    """Grade the task's own answer: `empty` is no change; `gold` and `oracle` are the reference solution: the gold
    patch of a SWE-style task, solution/solve.sh of a Terminal-Bench task."""
    if kind == "empty":
        return await verify_patch(agent, "", name)
    try:
        grader = grader_for(agent.reward.name)
    except Exception as exc:  # recorded on the row like any other grading failure
        return Verification(status=VerificationStatus.ERROR, error=str(exc))
    if grader.solves_by_script:
        return await _verify_in_fresh_sandbox(agent, "", name, oracle=True)
    if "patch" not in agent.reward.metadata:
        return Verification(status=VerificationStatus.ERROR, error=f"reward.metadata has no gold `patch` for {kind!r}")
    return await verify_patch(agent, agent.reward.metadata["patch"], name)


async def _verify_in_fresh_sandbox(agent: AgentConfig, patch: str, name: str, oracle: bool) -> Verification:
    started = time.monotonic()
    sandbox: Sandbox | None = None
    try:
        sandbox = await start_sandbox(agent, name=name)
        outcome = await grade_in_sandbox(sandbox, agent, patch, oracle)
    except Exception as exc:  # the sandbox did not start: recorded on the rollout, never lost
        outcome = Verification(status=VerificationStatus.ERROR, error=f"{type(exc).__name__}: {exc}")
    finally:
        if sandbox is not None:
            await sandbox.close()
    outcome.seconds = time.monotonic() - started
    return outcome


async def grade_in_sandbox(sandbox: Sandbox, agent: AgentConfig, patch: str = "",
                           oracle: bool = False) -> Verification:
    """Grade in a running sandbox: a fresh one with `patch` to apply, or the agent's own (no patch: its changes
    are in place) when reward.in_agent_sandbox. Every failure becomes the Verification's status and error."""
    started = time.monotonic()
    outcome = Verification()
    try:
        grader = grader_for(agent.reward.name)
        limit = grader.time_limit(agent.reward, oracle)
        try:
            await asyncio.wait_for(grader.grade(sandbox, agent, patch, outcome, oracle), limit)
            outcome.status = VerificationStatus(outcome.status)  # a grader's misspelt status is an error here
        except TimeoutError:
            outcome.status = VerificationStatus.TIMEOUT
            outcome.error = f"verification ran past {limit:g}s (eval_timeout={agent.reward.eval_timeout:g}s)"
    except Exception as exc:  # any failure here is recorded on the rollout, never lost
        outcome.status, outcome.error = VerificationStatus.ERROR, f"{type(exc).__name__}: {exc}"
    outcome.seconds = time.monotonic() - started
    return outcome
