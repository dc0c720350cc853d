"""The official evaluation of one patch, run inside a fresh sandbox whose workdir is the repository (/testbed).

The steps of swebench 4.1.0's `run_instance`, without Docker: write the model patch to /tmp/patch.diff and apply it
with the first of `git apply --verbose`, `git apply --verbose --reject`, `patch --batch --fuzz=5 -p1 -i` that exits
0 (none → patch_failed, which the official harness counts as an error); then run the eval script (spec.py: reset the
test files, apply the hidden test patch, run the spec's test command, reset again) with stdout and stderr together,
as the harness captures them; then grade the log (grading.py).

It runs on the Dask worker's event loop (the `swe_bench` grader, uni_agent/grading/): building the eval script and
grading the log run in a thread, as the first of them imports `swebench` (seconds) and a log can be megabytes.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..verification import VerificationStatus
from ..sandbox import Sandbox, write_file
from .environment_failures import environment_failure
from .grading import SweGrade, grade_log
from .spec import EVAL_SCRIPT_PATH, GIT_APPLY_CMDS, PATCH_PATH, WORKDIR, eval_script, install_step


@dataclass
class SweEvaluation:
    status: VerificationStatus = VerificationStatus.ERROR
    patch_applied: bool = False
    apply_command: str | None = None  # which of GIT_APPLY_CMDS applied the patch
    grade: SweGrade | None = None
    report: dict[str, Any] | None = None  # the official per-instance report, as get_eval_report returns it
    log: str = ""
    notes: list[str] = field(default_factory=list)


async def apply_patch(sandbox: Sandbox, workdir: str, patch: str, time_left: Callable[[], float]
                      ) -> tuple[str | None, str]:
    """Write `patch` into the sandbox and apply it at `workdir` (already shell-quoted) with the first of
    GIT_APPLY_CMDS that works, as the harness does: the command that applied it (None if none did) and every attempt's
    output."""
    await write_file(sandbox, PATCH_PATH, patch.encode())
    attempts = []
    for command in GIT_APPLY_CMDS:
        applied = await sandbox.exec(f"cd {workdir} && {command} {PATCH_PATH}", time_left())
        attempts.append(f"$ {command} {PATCH_PATH}\n{applied.output}")
        if applied.exit_code == 0:
            return command, "\n".join(attempts)
    return None, "\n".join(attempts)


async def evaluate_patch(sandbox: Sandbox, instance: Mapping[str, Any], patch: str, timeout: float) -> SweEvaluation:
    """Apply `patch` and run the official eval flow; `timeout` bounds the whole evaluation.

    The commands get a little less than `timeout` in all, so that a slow test run ends by the sandbox's own command
    timeout (status `timeout`, with the log so far) rather than by the caller cancelling it."""
    deadline = time.monotonic() + timeout - min(5.0, timeout * 0.1)
    left = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
    outcome = SweEvaluation()
    if sandbox.workdir != WORKDIR:
        raise RuntimeError(f"swe_bench grading needs the repository at {WORKDIR} (the official images' layout); "
                           f"this sandbox's workdir is {sandbox.workdir}")
    # Before touching the sandbox: an unknown repo/version fails here.
    script = await asyncio.to_thread(eval_script, instance)
    workdir = shlex.quote(WORKDIR)
    if patch.strip():
        outcome.apply_command, attempts = await apply_patch(sandbox, workdir, patch, left)
        outcome.patch_applied = outcome.apply_command is not None
        if not outcome.patch_applied:
            outcome.status, outcome.log = VerificationStatus.PATCH_FAILED, attempts
            outcome.notes.append(f"the patch did not apply with any of: {'; '.join(GIT_APPLY_CMDS)}")
            return outcome
    else:  # an empty patch (the official harness does not evaluate those): the tests run on the unchanged repo
        outcome.patch_applied = True
    await write_file(sandbox, EVAL_SCRIPT_PATH, script.encode())
    run = await sandbox.exec(f"cd {workdir} && /bin/bash {EVAL_SCRIPT_PATH} 2>&1", left())
    outcome.log = run.output
    if run.timed_out:
        outcome.status = VerificationStatus.TIMEOUT
        outcome.notes.append(f"the eval script timed out after {run.duration_s:.0f}s (eval_timeout {timeout:g}s; "
                             "the deployment's runtime_timeout also caps one command)")
        return outcome
    outcome.grade = await asyncio.to_thread(grade_log, instance, outcome.log)
    outcome.report = outcome.grade.report(patch)
    if not outcome.grade.tests_found:
        outcome.notes.append("the log has no test results between the harness's markers (graded as unresolved)")
    outcome.status = VerificationStatus.RESOLVED if outcome.grade.resolved else VerificationStatus.UNRESOLVED
    broken = None if outcome.grade.resolved else environment_failure(
        outcome.log, outcome.grade, patch, install_step(instance))
    if broken:  # the environment failed, not the answer: an infra error, never reward 0 blamed on the model
        outcome.status = VerificationStatus.ERROR
        outcome.notes.insert(0, f"broken test environment: {broken}")
    return outcome
