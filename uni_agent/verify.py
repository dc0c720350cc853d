"""Verification: grade a patch in a fresh sandbox (a Dask future: a plain function in a worker thread), or grade the
agent's own sandbox as it was left (`grade_in_sandbox`, called by the agent loop when reward.in_agent_sandbox).

Steps (the SWE-bench harness's order): apply the model's patch → reset the files the test patch touches (an
add-only test patch included) → apply the hidden test patch → run the tests → parse the log → grade.

Graders (the row's `reward.name`):
- `swe_local`: bundled and user tasks in SWE-bench form; pytest, our log parser (grading.py).
- `swe_bench`: SWE-bench instances in the official images; the official eval script, log parsers and resolution
  rule from the `swebench` package (uni_agent/swebench/, needs the `swebench` extra). SWE-Gym and SWE-rebench rows
  too: they carry their own test spec (spec.row_spec).
- `swe_smith`: SWE-smith instances (a bug injected into the source, per-repository images, no test patch): the
  bug patch sets the task state, then SWE-smith's harness steps and grading rule (uni_agent/swebench/smith.py).
- `terminal_bench`: Terminal-Bench 2 tasks; graded in the agent's own sandbox (its rows set in_agent_sandbox), or
  in a fresh sandbox of the task's image with the patch applied; the hidden tests run and write
  /logs/verifier/reward.txt|json (uni_agent/terminal_bench/verifier.py). The oracle runs solution/solve.sh first.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from typing import Literal

from .sandbox.start import start_sandbox
from .config import AgentConfig, ConfigError
from .grading import files_in_patch, grade, parse_pytest_log
from .sandbox import Sandbox, write_file
from .swebench.spec import test_list
from .verification import Verification

# Each grader and the reward.metadata keys it needs.
GRADERS: dict[str, tuple[str, ...]] = {
    "swe_local": ("test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"),
    "swe_bench": ("instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS"),
    "swe_smith": ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS"),
    "terminal_bench": ("task_id", "workdir", "tests_archive"),
}
ReferenceKind = Literal["gold", "empty", "oracle"]
DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider -q"
LOG_TAIL_CHARS = 8000


def check_reward_config(agent: AgentConfig, where: str) -> None:
    """Reject rows whose reward cannot be graded, before anything runs."""
    reward = agent.reward
    if reward.name not in GRADERS:
        raise ConfigError(f"{where}: reward.name {reward.name!r} is not a known grader; available: {tuple(GRADERS)}")
    for key in GRADERS[reward.name]:
        if key not in reward.metadata:
            raise ConfigError(f"{where}: reward.metadata lacks {key!r}")
    for key in ("FAIL_TO_PASS", "PASS_TO_PASS"):  # a list, or a JSON string of one (never its characters)
        if key in GRADERS[reward.name]:
            try:
                test_list(reward.metadata[key], f"reward.metadata.{key}")
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
    if reward.name == "swe_bench":
        from .swebench.spec import log_parser, repo_spec

        try:
            repo_spec(reward.metadata)  # the swebench package is installed and knows this repo/version (or the row
            log_parser(reward.metadata)  # carries its own spec), and the log parser exists
        except ConfigError as exc:
            raise ConfigError(f"{where}: reward.metadata: {exc}") from None
    if reward.name == "swe_smith":
        from .swebench.smith import check_metadata

        try:
            check_metadata(reward.metadata)
        except ConfigError as exc:
            raise ConfigError(f"{where}: reward.metadata: {exc}") from None


def verify_patch(agent: AgentConfig, patch: str, name: str = "verify") -> Verification:
    """Entry point for Dask: blocking, so it runs in a worker thread, with its own event loop."""
    return asyncio.run(verify_patch_async(agent, patch, name))


def verify_reference(agent: AgentConfig, kind: ReferenceKind, name: str = "verify") -> Verification:
    """Grade the task's own answer (for Dask, like verify_patch): `empty` is no change; `gold` and `oracle` are the
    reference solution: the gold patch of a SWE-style task, solution/solve.sh of a Terminal-Bench task."""
    if kind == "empty":
        return verify_patch(agent, "", name)
    if agent.reward.name == "terminal_bench":
        return asyncio.run(verify_patch_async(agent, "", name, oracle=True))
    if "patch" not in agent.reward.metadata:
        return Verification(status="error", error=f"reward.metadata has no gold `patch` for {kind!r}")
    return verify_patch(agent, agent.reward.metadata["patch"], name)


def _grading_limit(agent: AgentConfig, oracle: bool) -> float:
    """Seconds the grading may take once the sandbox is up. A Terminal-Bench test script has eval_timeout itself
    (enforced in the sandbox, so what it wrote is still read back); the bound leaves room around it, and the oracle's
    solve.sh has the agent's timeout on top."""
    if agent.reward.name != "terminal_bench":
        return agent.reward.eval_timeout
    from .terminal_bench.verifier import COMMAND_OVERHEAD_S

    solve = float(agent.reward.metadata.get("agent_timeout_sec", 600)) + COMMAND_OVERHEAD_S if oracle else 0.0
    return agent.reward.eval_timeout + COMMAND_OVERHEAD_S + solve


async def verify_patch_async(agent: AgentConfig, patch: str, name: str = "verify",
                             oracle: bool = False) -> Verification:
    """Grade `patch` in a fresh sandbox (started here, closed here)."""
    started = time.monotonic()
    sandbox: Sandbox | None = None
    try:
        sandbox = await start_sandbox(agent, name=name)
        outcome = await grade_in_sandbox(sandbox, agent, patch, oracle)
    except Exception as exc:  # the sandbox did not start: recorded on the rollout, never lost
        outcome = Verification(status="error", error=f"{type(exc).__name__}: {exc}")
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
    limit = _grading_limit(agent, oracle)
    try:
        await asyncio.wait_for(_grade_in(sandbox, agent, patch, outcome, oracle), limit)
    except TimeoutError:
        outcome.status, outcome.error = "timeout", f"verification ran past {limit:g}s (eval_timeout=" \
                                                   f"{agent.reward.eval_timeout:g}s)"
    except Exception as exc:  # any failure here is recorded on the rollout, never lost
        outcome.status, outcome.error = "error", f"{type(exc).__name__}: {exc}"
    outcome.seconds = time.monotonic() - started
    return outcome


async def _grade_in(sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification, oracle: bool) -> None:
    if agent.reward.name == "terminal_bench":
        from .terminal_bench.verifier import grade_terminal_bench

        await grade_terminal_bench(sandbox, agent, patch, outcome, oracle)
    elif agent.reward.name == "swe_bench":
        await _grade_swe_bench(sandbox, agent, patch, outcome)
    elif agent.reward.name == "swe_smith":
        from .swebench.smith import grade_swe_smith

        await grade_swe_smith(sandbox, agent, patch, outcome)
    else:
        await _grade_swe_local(sandbox, agent, patch, outcome)


async def _grade_swe_bench(sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification) -> None:
    from .swebench.evaluate import evaluate_patch

    evaluation = await evaluate_patch(sandbox, agent.reward.metadata, patch, agent.reward.eval_timeout)
    outcome.status, outcome.patch_applied = evaluation.status, evaluation.patch_applied
    outcome.log_tail, outcome.report = evaluation.log[-LOG_TAIL_CHARS:], evaluation.report
    if evaluation.grade is not None:
        outcome.fail_to_pass, outcome.pass_to_pass = evaluation.grade.fail_to_pass, evaluation.grade.pass_to_pass
        outcome.resolved = evaluation.grade.resolved
        outcome.reward = 1.0 if outcome.resolved else 0.0
    if evaluation.notes:
        outcome.error = "; ".join(evaluation.notes)


async def _grade_swe_local(sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification) -> None:
    meta = agent.reward.metadata
    test_patch: str = meta["test_patch"]
    timeout = agent.reward.eval_timeout
    workdir = shlex.quote(sandbox.workdir)
    if patch.strip():
        await write_file(sandbox, "/tmp/model.patch", patch.encode())
        applied = await sandbox.exec(f"cd {workdir} && git apply --whitespace=nowarn /tmp/model.patch", timeout)
        if applied.exit_code != 0:
            outcome.status, outcome.log_tail = "patch_failed", applied.output[-LOG_TAIL_CHARS:]
            return
    outcome.patch_applied = True
    f2p = test_list(meta["FAIL_TO_PASS"], "FAIL_TO_PASS")
    p2p = test_list(meta["PASS_TO_PASS"], "PASS_TO_PASS")
    test_id_files = list(dict.fromkeys(t.split("::")[0] for t in f2p + p2p))
    # An empty test_patch means no test changes: the tests are already in the repository (SWE-smith's tasks).
    has_test_patch = bool(test_patch.strip())
    # The agent may have edited or created the test files; reset them so only the reference tests count: those the
    # test patch touches, or (no test patch) the files of the FAIL_TO_PASS / PASS_TO_PASS tests, as SWE-smith's
    # harness reverts changes to them.
    test_files = files_in_patch(test_patch) if has_test_patch else test_id_files
    resets = " ; ".join(
        f"(git checkout HEAD -- {shlex.quote(f)} 2>/dev/null || rm -f -- {shlex.quote(f)})" for f in test_files
    )
    apply_tests = "true"
    if has_test_patch:
        await write_file(sandbox, "/tmp/test.patch", test_patch.encode())
        apply_tests = "git apply --whitespace=nowarn /tmp/test.patch"
    prepared = await sandbox.exec(f"cd {workdir} && {{ {resets or 'true'} ; }} && {apply_tests}", timeout)
    if prepared.exit_code != 0:
        raise RuntimeError(f"the test patch did not apply: {prepared.output[-2000:]}")
    targets = list(dict.fromkeys(test_files + test_id_files))
    test_cmd = meta.get("test_cmd", DEFAULT_TEST_CMD)
    run = await sandbox.exec(f"cd {workdir} && {test_cmd} {' '.join(map(shlex.quote, targets))}", timeout)
    log = run.output
    outcome.log_tail = log[-LOG_TAIL_CHARS:]
    if run.timed_out:
        outcome.status = "timeout"
        return
    result = grade(f2p, p2p, parse_pytest_log(log))
    outcome.fail_to_pass, outcome.pass_to_pass = result.fail_to_pass, result.pass_to_pass
    outcome.resolved, outcome.reward = result.resolved, result.reward
    outcome.status = "resolved" if result.resolved else "unresolved"
