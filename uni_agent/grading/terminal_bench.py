"""The `terminal_bench` grader: Terminal-Bench 2 tasks, graded in the agent's own sandbox (their rows set
reward.in_agent_sandbox) or in a fresh sandbox of the task's image with the patch applied.

The reward contract, run in a sandbox: unpack the hidden tests at /tests, run `bash /tests/test.sh` in
the task's workdir under the verifier timeout, then read /logs/verifier/reward.txt (one number; read first) or
/logs/verifier/reward.json (an object of numbers: its `reward`, or its only value). Also the oracle: unpack the
solution at /solution and run `bash /solution/solve.sh` in the workdir under the agent timeout.

Each step is one sandbox command that unpacks, runs and reports together: the local (bubblewrap) backend gives every
command a fresh root, so /tests and /logs exist only during the command that made them. The test script runs under
`timeout` inside the sandbox, so a slow test is stopped there and what it wrote is still read back.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..sandbox import Sandbox, write_file
from ..verification import VerificationStatus

if TYPE_CHECKING:
    from ..config import AgentConfig, RewardConfig
    from ..verification import Verification

VERIFIER_DIR = "/logs/verifier"
REWARD_FILES = ("reward.txt", "reward.json")
KILL_GRACE_S = 5  # after the timeout's TERM, KILL follows this many seconds later
COMMAND_OVERHEAD_S = 60.0  # unpacking and reporting around the script, on top of its own timeout
LOG_TAIL_BYTES = 6000
EXIT_MARK, FILE_MARK, LOG_MARK = "__UA_TB_EXIT__", "__UA_TB_FILE__", "__UA_TB_LOG__"


class RewardFileError(ValueError):
    """The verifier left no usable reward: the message says which file and why."""


@dataclass
class ScriptRun:
    """What one run of test.sh or solve.sh left behind."""

    exit_code: int | None = None
    timed_out: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    log: str = ""
    setup_error: str | None = None  # the script never ran: the archive did not unpack, the workdir is missing


@dataclass
class Reward:
    value: float
    source: str  # reward.txt | reward.json
    metrics: dict[str, float]


def _exports(env: dict[str, str]) -> str:
    return "".join(f"export {k}={shlex.quote(v)}; " for k, v in env.items())


def _script(mount: str, script: str, workdir: str, env: dict[str, str], timeout: float, log_files: str,
            report_files: tuple[str, ...]) -> str:
    """One command: unpack the archive (stdin, base64 tar.gz) at `mount`, run `script` in `workdir` under `timeout`,
    then print the exit code, the files asked for (base64) and the log's tail, each after a marker line."""
    m, w = shlex.quote(mount), shlex.quote(workdir)
    reports = " ".join(shlex.quote(f) for f in report_files)
    return f"""rm -rf {m} && mkdir -p {m} /logs/agent {VERIFIER_DIR} /logs/artifacts || {{ echo "no {m}"; exit 90; }}
rm -f {VERIFIER_DIR}/reward.txt {VERIFIER_DIR}/reward.json
base64 -d | tar -xzf - -C {m} || {{ echo "cannot unpack the archive at {mount}"; exit 91; }}
chmod -R a+rX {m}; chmod 777 /logs/agent {VERIFIER_DIR} /logs/artifacts
cd {w} || {{ echo "the task's workdir {workdir} does not exist"; exit 92; }}
SECONDS=0
( {_exports(env)}exec timeout -k {KILL_GRACE_S} {timeout:.3f} bash {m}/{shlex.quote(script)} ) {log_files}
echo "{EXIT_MARK} $? $SECONDS"
for f in {reports}; do [ -f "$f" ] && printf '{FILE_MARK} %s %s\\n' "$f" "$(base64 -w0 "$f")"; done
echo "{LOG_MARK}"
"""


def _parse(output: str, exit_code: int | None, timeout: float) -> ScriptRun:
    run = ScriptRun()
    seconds = 0
    head, _, tail = output.partition(f"\n{LOG_MARK}\n") if f"\n{LOG_MARK}\n" in output else (output, "", "")
    for line in head.splitlines():
        if line.startswith(EXIT_MARK):
            _, code, seconds_text = line.split()
            run.exit_code, seconds = int(code), int(seconds_text)
        elif line.startswith(FILE_MARK):
            parts = line.split(" ", 2)
            try:
                run.files[parts[1].rsplit("/", 1)[-1]] = base64.b64decode(parts[2] if len(parts) > 2 else "")
            except (binascii.Error, IndexError):
                pass  # reported as unreadable below: the file is missing from `files`
    if run.exit_code is None:
        run.setup_error = head.strip()[-2000:] or f"the command failed (exit {exit_code})"
    # `timeout` exits 124 when its TERM ended the script, 137 when KILL had to follow; 137 earlier is an OOM kill.
    run.timed_out = run.exit_code == 124 or (run.exit_code == 128 + 9 and seconds >= timeout - 1)
    run.log = tail
    return run


async def _run(sandbox: Sandbox, archive_b64: str, mount: str, script: str, workdir: str, env: dict[str, str],
               timeout: float, log_files: str, tails: str, report_files: tuple[str, ...] = ()) -> ScriptRun:
    command = _script(mount, script, workdir, env, timeout, log_files, report_files) + tails
    result = await sandbox.exec(command, timeout + COMMAND_OVERHEAD_S, stdin=archive_b64.encode())
    if result.timed_out:  # the in-sandbox timeout should have acted first; the sandbox itself is stuck
        return ScriptRun(timed_out=True, setup_error=f"no answer from the sandbox within {timeout:g} s")
    return _parse(result.output, result.exit_code, timeout)


async def run_solution(sandbox: Sandbox, meta: dict[str, Any], timeout: float) -> ScriptRun:
    """The oracle: solution/solve.sh at /solution, run in the workdir; its output goes to /logs/agent/oracle.txt."""
    log = "/logs/agent/oracle.txt"
    return await _run(sandbox, meta["solution_archive"], "/solution", "solve.sh", meta["workdir"],
                      json.loads(meta.get("solution_env") or "{}"), timeout, f"> {log} 2>&1",
                      f"tail -c {LOG_TAIL_BYTES} {log}\n")


async def run_tests(sandbox: Sandbox, meta: dict[str, Any], timeout: float) -> ScriptRun:
    """tests/ at /tests, `bash /tests/test.sh` in the workdir; stdout and stderr go to /logs/verifier/test-*.txt."""
    out, err = f"{VERIFIER_DIR}/test-stdout.txt", f"{VERIFIER_DIR}/test-stderr.txt"
    return await _run(sandbox, meta["tests_archive"], "/tests", "test.sh", meta["workdir"],
                      json.loads(meta.get("verifier_env") or "{}"), timeout, f"> {out} 2> {err}",
                      f"tail -c {LOG_TAIL_BYTES} {out}; tail -c {LOG_TAIL_BYTES // 3} {err}\n",
                      tuple(f"{VERIFIER_DIR}/{name}" for name in REWARD_FILES))


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise RewardFileError(f"{what} is not a number: {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise RewardFileError(f"{what} is not a number: {str(value)[:80]!r}") from None
    if not math.isfinite(number):
        raise RewardFileError(f"{what} is not a finite number: {value!r}")
    return number


def read_reward(files: dict[str, bytes], exit_code: int | None) -> Reward:
    """The reward from the files test.sh left: reward.txt first, then reward.json. RewardFileError says why not."""
    if "reward.txt" in files:
        text = files["reward.txt"].decode("utf-8", "replace").strip()
        if not text:
            raise RewardFileError(f"reward file empty: {VERIFIER_DIR}/reward.txt")
        value = _number(text, f"{VERIFIER_DIR}/reward.txt")
        return Reward(value, "reward.txt", {"reward": value})
    if "reward.json" in files:
        path = f"{VERIFIER_DIR}/reward.json"
        try:
            data = json.loads(files["reward.json"])
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RewardFileError(f"reward file unreadable: {path} is not valid JSON ({exc})") from None
        if not isinstance(data, dict) or not data:
            raise RewardFileError(f"reward file unreadable: {path} must be a non-empty object of numbers")
        metrics = {str(k): _number(v, f"{path} key {k!r}") for k, v in data.items()}
        if "reward" in metrics:
            return Reward(metrics["reward"], "reward.json", metrics)
        if len(metrics) == 1:
            return Reward(next(iter(metrics.values())), "reward.json", metrics)
        raise RewardFileError(f"reward file unreadable: {path} has several metrics and no 'reward' key "
                              f"({sorted(metrics)})")
    raise RewardFileError(f"reward file missing: {VERIFIER_DIR}/reward.txt (and no reward.json); "
                          f"test.sh exited {exit_code}")


async def _apply_patch(sandbox: Sandbox, workdir: str, patch: str, timeout: float) -> str | None:
    """Apply the agent's changes under the workdir; the failure's output, or None. `git apply` works in a directory
    that is not a repository too (the task image's workdir usually is not)."""
    await write_file(sandbox, "/tmp/uni-agent-model.patch", patch.encode())
    applied = await sandbox.exec(f"cd {shlex.quote(workdir)} && git apply --whitespace=nowarn "
                                 f"/tmp/uni-agent-model.patch", timeout)
    return None if applied.exit_code == 0 else applied.output[-LOG_TAIL_BYTES:] or f"exit {applied.exit_code}"


async def grade_terminal_bench(sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification,
                               oracle: bool = False) -> None:
    """Fill `outcome`: the patch applied (or the oracle run), the tests run, the reward read. The reward is the
    number the verifier wrote; `resolved` means full marks (reward >= 1)."""
    meta = agent.reward.metadata
    verifier_timeout = agent.reward.eval_timeout
    notes: list[str] = []
    log = ""
    if oracle:
        if not meta.get("solution_archive"):
            outcome.status, outcome.error = "error", f"task {meta['task_id']} has no solution/solve.sh for the oracle"
            return
        agent_timeout = float(meta.get("agent_timeout_sec", 600))
        solved = await run_solution(sandbox, meta, agent_timeout)
        if solved.setup_error:
            outcome.status, outcome.error = "error", f"the oracle did not run: {solved.setup_error}"
            return
        if solved.timed_out:
            notes.append(f"solve.sh ran past the agent timeout of {agent_timeout:g}s")
        elif solved.exit_code:
            notes.append(f"solve.sh exited {solved.exit_code}")
        log = f"--- solve.sh (exit {solved.exit_code}) ---\n{solved.log}\n"
    elif patch.strip():
        failure = await _apply_patch(sandbox, meta["workdir"], patch, verifier_timeout)
        if failure is not None:
            outcome.status, outcome.log_tail = VerificationStatus.PATCH_FAILED, failure
            return
    outcome.patch_applied = True
    tests = await run_tests(sandbox, meta, verifier_timeout)
    outcome.log_tail = (log + f"--- test.sh (exit {tests.exit_code}) ---\n{tests.log}")[-LOG_TAIL_BYTES:]
    if tests.setup_error:
        outcome.status, outcome.error = "error", f"the tests did not run: {tests.setup_error}"
    elif tests.timed_out:
        outcome.status = VerificationStatus.TIMEOUT
        notes.append(f"test.sh ran past the verifier timeout of {verifier_timeout:g}s")
    else:
        try:
            reward = read_reward(tests.files, tests.exit_code)
        except RewardFileError as exc:
            outcome.status = VerificationStatus.ERROR
            notes.insert(0, str(exc))
        else:
            outcome.reward, outcome.reward_source, outcome.metrics = reward.value, reward.source, reward.metrics
            outcome.resolved = reward.value >= 1.0
            outcome.status = VerificationStatus.RESOLVED if outcome.resolved else VerificationStatus.UNRESOLVED
    if notes:
        outcome.error = "; ".join(notes)


class TerminalBenchGrader:
    name = "terminal_bench"
    required_metadata = ("task_id", "workdir", "tests_archive")
    solves_by_script = True

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        pass

    def time_limit(self, reward: RewardConfig, oracle: bool) -> float:
        """test.sh has eval_timeout itself (enforced in the sandbox, so what it wrote is still read back); the bound
        leaves room around it, and the oracle's solve.sh has the agent's timeout on top."""
        solve = float(reward.metadata.get("agent_timeout_sec", 600)) + COMMAND_OVERHEAD_S if oracle else 0.0
        return reward.eval_timeout + COMMAND_OVERHEAD_S + solve

    async def grade(self, sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification,
                    oracle: bool) -> None:
        await grade_terminal_bench(sandbox, agent, patch, outcome, oracle)
