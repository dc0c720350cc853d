"""Whose failure a rollout is: `none` (resolved), `model` (it ran out of turns, context or time, or its answer was
wrong) or `infra` (a sandbox, the LLM endpoint, an agent worker or the grader failed; or its wall clock ran out while
every engine was down: exit reason engine_down, settled by the envelope where the episode ends). An infra row is not a model result: the summary counts it apart,
and `--retry-errors` runs it again (an engine_down row runs again without it).

The one place a row is classified. The episode's ending says which part failed when it knows (an Ending with a
FailedPart, uni_agent.episode.ending), `classify` settles the rest from the ending and the verification: once when
the episode ends (the envelope) and again when a grade is recorded (RolloutResult.record)."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol

from ..verification import Verification, VerificationStatus
from .exit_reason import ExitReason


class FailureKind(StrEnum):
    NONE = "none"  # resolved, or submitted and not graded
    MODEL = "model"  # the model's: out of turns, context or time, or a wrong answer
    INFRA = "infra"  # the infrastructure's (FailedPart says which part): not a model result


class FailedPart(StrEnum):
    """Which part of the infrastructure failed: what failure_cause starts with ("llm: HTTP 500 ...")."""

    SANDBOX = "sandbox"
    LLM = "llm"
    AGENT = "agent"  # the episode's own machinery ended in an error no other part owned
    HARNESS = "harness"  # a harness command that could not run at all (exit 126/127)
    WORKER = "worker"  # the agent worker running the rollout was lost, again and again
    VERIFICATION = "verification"  # the grader could not run, or gave no result in time


FAILURE_KINDS: tuple[str, ...] = tuple(kind.value for kind in FailureKind)


class Classified(Protocol):
    """What classification reads and writes of a row (a RolloutResult)."""

    exit_reason: ExitReason
    error: str | None
    failure_kind: FailureKind
    failure_cause: str | None
    verification: Verification | None
    resolved: bool
    started_at: float


def infra(result: Classified, part: FailedPart, error: str) -> None:
    """Mark `result` an infrastructure failure of `part`."""
    result.failure_kind, result.failure_cause = FailureKind.INFRA, f"{FailedPart(part).value}: {error}"[:2000]


def classify(result: Classified) -> None:
    """Set failure_kind/failure_cause from the episode's end and the grade. A failure marked infra stays infra."""
    if result.failure_kind == FailureKind.INFRA:
        return
    verification = result.verification  # None until graded
    try:
        status = None if verification is None else VerificationStatus(verification.status)
    except ValueError:  # no grader writes it: a broken grader, not a wrong answer
        infra(result, FailedPart.VERIFICATION, f"unknown verification status {verification.status!r}")
        return
    if result.exit_reason == ExitReason.ERROR:  # an error no part owned: the episode's own machinery failed
        infra(result, FailedPart.AGENT, result.error or "the episode ended in an error")
        return
    if verification is not None and (status == VerificationStatus.ERROR or verification.lost):
        infra(result, FailedPart.VERIFICATION, verification.error or status)
        return
    if result.resolved:
        result.failure_kind, result.failure_cause = FailureKind.NONE, None
        return
    if result.exit_reason == ExitReason.SUBMITTED and status is None:  # not graded (yet, or --no-verify)
        result.failure_kind, result.failure_cause = FailureKind.NONE, "not verified"
        return
    result.failure_kind = FailureKind.MODEL
    if result.exit_reason != ExitReason.SUBMITTED:  # max_turns, context_limit, command_timeouts, wall_clock, ...
        # (malformed calls end as max_turns)
        result.failure_cause = result.exit_reason.value
    elif status in (VerificationStatus.PATCH_FAILED, VerificationStatus.TIMEOUT):
        result.failure_cause = f"verification {status}"  # the model's patch did not apply or hung
    else:
        result.failure_cause = "unresolved"
