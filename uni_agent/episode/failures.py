"""Whose failure a rollout is: `none` (resolved), `model` (it ran out of turns, context or time, or its answer was
wrong) or `infra` (a sandbox, the LLM endpoint, an agent worker or the grader failed; or its wall clock ran out while
every engine was down: exit reason engine_down). An infra row is not a model result: the summary counts it apart,
and `--retry-errors` runs it again (an engine_down row runs again without it).

The agent loop knows which part failed (it catches the exception) and calls `infra`; `classify` settles the rest
from the episode's end and the verification recorded on the row (called again once the grade is known)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..grading.verification import NO_RESULT, VerificationStatus, stored_status
from ..llm.outage import engine_outage_s
from .exit_reason import ExitReason

if TYPE_CHECKING:
    from .rollout import RolloutResult


def infra(result: RolloutResult, part: str, error: str) -> None:
    """Mark `result` an infrastructure failure of `part` (sandbox, llm, worker, verification)."""
    result.failure_kind, result.failure_cause = "infra", f"{part}: {error}"[:2000]


def classify(result: RolloutResult) -> None:
    """Set failure_kind/failure_cause from the episode's end and the grade. A failure marked infra stays infra."""
    if result.failure_kind == "infra":
        return
    if result.exit_reason == ExitReason.WALL_CLOCK and (down_s := engine_outage_s(result.started_at)) > 0:
        # Its clock ran while no engine could answer it (a lost engine waited for, llm_waiting_for_endpoint): the
        # time was the outage's, so the end is not the model's.
        result.exit_reason = ExitReason.ENGINE_DOWN.value
        result.error = f"every engine was down for {down_s:.0f} s of this episode, which then ran past its " \
                       f"wall-clock budget ({result.error})"
        infra(result, "llm", result.error)
        return
    verification = json.loads(result.verification or "{}")  # "{}" until graded
    verification_error = verification.get("error")
    try:
        verification_status = stored_status(verification)
    except ValueError:  # no grader writes it: a broken grader, not a wrong answer
        infra(result, "verification", f"unknown verification status {verification['status']!r}")
        return
    if result.exit_reason == ExitReason.ERROR:  # an error the loop did not attribute: the loop's own machinery failed
        infra(result, "agent", result.error or "the episode ended in an error")
        return
    if verification_status == VerificationStatus.ERROR or (verification_status == VerificationStatus.TIMEOUT
                                                           and (verification_error or "").startswith(NO_RESULT)):
        infra(result, "verification", verification_error or verification_status)
        return
    if result.resolved:
        result.failure_kind, result.failure_cause = "none", None
        return
    if result.exit_reason == ExitReason.SUBMITTED and verification_status is None:  # not graded (yet, or --no-verify)
        result.failure_kind, result.failure_cause = "none", "not verified"
        return
    result.failure_kind = "model"
    if result.exit_reason != ExitReason.SUBMITTED:  # max_turns, context_limit, command_timeouts, wall_clock
        # (malformed calls end as max_turns)
        result.failure_cause = result.exit_reason
    elif verification_status in (VerificationStatus.PATCH_FAILED, VerificationStatus.TIMEOUT):
        result.failure_cause = f"verification {verification_status}"  # the model's patch did not apply or hung
    else:
        result.failure_cause = "unresolved"

