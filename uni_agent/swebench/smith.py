"""SWE-smith tasks (SWE-bench/SWE-smith): a bug injected into a repository's source, one image per repository, no
test patch (the FAIL_TO_PASS tests already live in the repository). Its harness's steps and the grader `swe_smith`;
the rows are made in smith_rows.py.

What SWE-smith's own harness does (the `swesmith` package, 0.0.9: harness/{eval,utils,grading}.py, profiles/), and
we match:

- `patch` is the diff that *introduces* the bug; the gold answer is its reverse (the harness applies gold
  predictions with `git apply --reverse`). Rows keep it as `bug_patch` and the reverse as `patch`, the gold answer
  every other grader has under that name.
- `image_name` (e.g. `swebench/swesmith.x86_64.<owner>_1776_<repo>.<commit8>`) holds the clean repository at
  /testbed with a `testbed` conda env. A task's branch holds two commits: the bug, then the removal of the
  FAIL_TO_PASS tests' files; the agent works on the branch tip, the evaluation on the bug commit (tests back). We
  build the same two states without the network: apply `bug_patch` and commit; for the agent (the row's
  post_setup_cmd) also remove the FAIL_TO_PASS test files and commit, so its diff is its answer alone.
- Evaluation: apply the answer with the first of `git apply --verbose`, `... --reject`, `patch --batch --fuzz=5 -p1`
  that works (none: the patch failed, an error); revert changes to the tests' files; run the repository profile's
  test command (Python default: activate the conda env, then `pytest --disable-warnings --color=no --tb=no
  --verbose`, the whole suite) between `: '>>>>> Start Test Output'` and `: '>>>>> End Test Output'` under
  `set -uxo pipefail`; past the timeout the instance is unresolved.
- Grading: the log between the traced markers (`+ : '>>>>> Start Test Output'`) is parsed by the profile's parser
  (Python: `<test id> <STATUS>` lines of pytest --verbose); PASSED / XFAIL pass, FAILED / ERROR and a test missing
  from the log fail, other statuses (SKIPPED) count neither way; resolved when swebench's get_resolution_status says
  FULL. (Older SWE-smith sources counted a missing test as passed; the released package does not, nor do we.)
  tests/fixtures/swe_smith/crosscheck_swesmith.py compares our grades with the package's on real logs.

Repositories whose profile overrides the test command or parser (a few do, e.g. `-rA` summary lines) need the row's
`test_cmd` / `log_parser` (`pytest_verbose`, the default, or `pytest_summary`).
"""

from __future__ import annotations

import base64
import re
import shlex
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from ..config import ConfigError
from ..tasks.rows import test_list
from ..verification import VerificationStatus
from .spec import GIT_APPLY_CMDS, WORKDIR

if TYPE_CHECKING:
    from ..config import AgentConfig
    from ..sandbox import Sandbox
    from ..verification import Verification

REWARD_NAME = "swe_smith"
DEFAULT_TEST_CMD = ("source /opt/miniconda3/bin/activate; conda activate testbed; "
                    "pytest --disable-warnings --color=no --tb=no --verbose")
START_MARKER, END_MARKER = ">>>>> Start Test Output", ">>>>> End Test Output"
APPLY_PATCH_FAIL, TESTS_TIMEOUT = ">>>>> Patch Apply Failed", ">>>>> Tests Timed Out"  # swebench's markers
EVAL_SCRIPT_PATH = "/tmp/swesmith_eval.sh"
STATUSES = ("FAILED", "PASSED", "SKIPPED", "ERROR", "XFAIL")  # swebench's TestStatus values
LOG_PARSERS = {
    # `tests/test_x.py::test_a PASSED [ 10%]` (pytest --verbose): SWE-smith's Python default
    "pytest_verbose": re.compile(rf"^(?P<test>\S+)\s+(?P<status>{'|'.join(STATUSES)})"),
    # `PASSED tests/test_x.py::test_a` (pytest -rA summary): profiles that run with -rA
    "pytest_summary": re.compile(rf"^(?P<status>{'|'.join(STATUSES)})\s(?P<test>\S+)"),
}
LOG_TAIL_CHARS = 8000


def reverse_patch(diff: str) -> str:
    """The reverse of a unified diff that only modifies files (what `git apply --reverse` applies), as text: the
    gold answer of a SWE-smith task. SWE-smith's bugs rewrite existing code; a diff that adds, deletes or renames a
    file is refused rather than reversed half-way."""
    out: list[str] = []
    lines = diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith(("new file mode", "deleted file mode", "rename from", "copy from", "GIT binary patch")):
            raise ConfigError(f"patch: cannot reverse {line.strip()!r} (only diffs that modify files are supported)")
        if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            old, new = line[4:], lines[i + 1][4:]
            out += ["--- " + _swap_side(new, "b/", "a/"), "+++ " + _swap_side(old, "a/", "b/")]
            i += 2
            continue
        if line.startswith("diff --git "):
            parts = line.rstrip("\n").split(" ")
            if len(parts) == 4:
                line = f"diff --git {_swap_side(parts[3], 'b/', 'a/')} {_swap_side(parts[2], 'a/', 'b/')}\n"
        elif line.startswith("index "):
            match = re.match(r"index ([0-9a-f]+)\.\.([0-9a-f]+)(.*)", line, re.S)
            if match:
                line = f"index {match.group(2)}..{match.group(1)}{match.group(3)}"
        elif line.startswith("@@"):
            match = re.match(r"@@ -(\S+) \+(\S+) @@(.*)", line, re.S)
            if match:
                line = f"@@ -{match.group(2)} +{match.group(1)} @@{match.group(3)}"
        elif line.startswith("+"):
            line = "-" + line[1:]
        elif line.startswith("-"):
            line = "+" + line[1:]
        out.append(line)
        i += 1
    return "".join(out)


def _swap_side(path: str, old_prefix: str, new_prefix: str) -> str:
    return new_prefix + path[len(old_prefix):] if path.startswith(old_prefix) else path


def repo_name(meta: Mapping[str, Any]) -> str:
    """`swesmith/<owner>__<repo>.<commit8>` → `<owner>__<repo>.<commit8>` (one image, one local checkout each)."""
    return str(meta["repo"]).rsplit("/", 1)[-1]


def check_metadata(meta: Mapping[str, Any]) -> None:
    """What grading needs, checked before anything runs (each error names its field)."""
    for name in ("bug_patch", "patch"):
        if not isinstance(meta.get(name), str) or not meta[name].strip():
            raise ConfigError(f"{name} must be a non-empty unified diff")
    if not test_list(meta["FAIL_TO_PASS"], "FAIL_TO_PASS"):
        raise ConfigError("FAIL_TO_PASS is empty: there is nothing to grade")
    test_list(meta["PASS_TO_PASS"], "PASS_TO_PASS")
    parser = meta.get("log_parser") or "pytest_verbose"
    if parser not in LOG_PARSERS:
        raise ConfigError(f"log_parser {parser!r} is not known; choose one of {', '.join(LOG_PARSERS)}")


def task_state_command(meta: Mapping[str, Any], workdir: str = WORKDIR) -> str:
    """Put the repository at the task state: apply the bug patch and commit it, so that later diffs are answers
    alone. The patch travels base64-encoded inside the command (no file to upload, any content)."""
    encoded = base64.b64encode(meta["bug_patch"].encode()).decode()
    message = shlex.quote(f"SWE-smith task state: {meta['instance_id']}")
    return (f"cd {shlex.quote(workdir)} && printf %s {encoded} | base64 -d > /tmp/swesmith_bug.diff"
            f" && git apply /tmp/swesmith_bug.diff && rm -f /tmp/swesmith_bug.diff && git add -A"
            f" && git -c user.name=uni-agent -c user.email=uni-agent@localhost commit -q --no-verify -m {message}")


def test_files(meta: Mapping[str, Any], which: str = "FAIL_TO_PASS") -> list[str]:
    """The files of a test list (`path::name` → path), as SWE-smith's Python profile lists them."""
    return sorted({t.split("::", 1)[0] for t in test_list(meta[which], which)})


def agent_setup_command(meta: Mapping[str, Any]) -> str:
    """The row's post_setup_cmd: the task state, the FAIL_TO_PASS test files removed and committed (the branch tip
    SWE-smith's agents see), then the image's test environment for the agent's commands."""
    files = " ".join(shlex.quote(f) for f in test_files(meta))
    return (task_state_command(meta) + f" && git rm -q --ignore-unmatch -- {files}"
            " && git -c user.name=uni-agent -c user.email=uni-agent@localhost commit -q --no-verify --allow-empty"
            " -m 'Remove F2P Tests' && { if [ -f /opt/miniconda3/bin/activate ]; then"
            " source /opt/miniconda3/bin/activate testbed; fi; }")


def eval_script(meta: Mapping[str, Any], workdir: str = WORKDIR) -> str:
    """SWE-smith's eval script: traced, the test command (which activates the env itself) between markers."""
    return "\n".join([
        "#!/bin/bash",
        "set -uxo pipefail",
        f"cd {workdir}",
        f": '{START_MARKER}'",
        meta.get("test_cmd") or DEFAULT_TEST_CMD,
        f": '{END_MARKER}'",
    ]) + "\n"


def test_output(log: str) -> tuple[str, bool]:
    """The test command's output between the traced markers, and whether both were there (SWE-smith's
    read_test_output: a patch-failure or timeout marker means no results)."""
    if APPLY_PATCH_FAIL in log or TESTS_TIMEOUT in log:
        return "", False
    start, end = f"+ : '{START_MARKER}'", f"+ : '{END_MARKER}'"
    if start not in log or end not in log:
        return log, False
    start_at, end_at = log.find(start), log.find(end)
    if start_at > end_at:
        return "", False
    return log[start_at + len(start):end_at], True


def parse_log(log: str, parser: str = "pytest_verbose") -> dict[str, str]:
    pattern = LOG_PARSERS[parser]
    statuses: dict[str, str] = {}
    for line in log.split("\n"):
        match = pattern.match(line)
        if match:
            statuses[match.group("test")] = match.group("status")
    return statuses


@dataclass
class SmithGrade:
    tests_found: bool
    status_map: dict[str, str]
    fail_to_pass: dict[str, str]  # each test → its status, MISSING when absent (counted as failed)
    pass_to_pass: dict[str, str]
    tests_status: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    resolved: bool = False


def grade_log(meta: Mapping[str, Any], log: str) -> SmithGrade:
    """SWE-smith's get_eval_report on the eval script's output."""
    from swebench.harness.constants import FAIL_TO_PASS, PASS_TO_PASS, ResolvedStatus
    from swebench.harness.grading import get_resolution_status

    f2p, p2p = test_list(meta["FAIL_TO_PASS"], "FAIL_TO_PASS"), test_list(meta["PASS_TO_PASS"], "PASS_TO_PASS")
    output, found = test_output(log)
    status_map = parse_log(output, meta.get("log_parser") or "pytest_verbose") if found else {}
    grade = SmithGrade(found, status_map, {t: status_map.get(t, "MISSING") for t in f2p},
                       {t: status_map.get(t, "MISSING") for t in p2p})
    if not found:
        return grade

    def split(tests: list[str]) -> dict[str, list[str]]:
        # PASSED / XFAIL pass; FAILED / ERROR / missing fail; anything else (SKIPPED) neither.
        success = [t for t in tests if status_map.get(t) in ("PASSED", "XFAIL")]
        failure = [t for t in tests if status_map.get(t, "FAILED") in ("FAILED", "ERROR")]
        return {"success": success, "failure": failure}

    grade.tests_status = {FAIL_TO_PASS: split(f2p), PASS_TO_PASS: split(p2p)}
    grade.resolved = get_resolution_status(grade.tests_status) == ResolvedStatus.FULL.value
    return grade


async def grade_swe_smith(sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification) -> None:
    """Grade `patch` in a fresh sandbox of the task's image: task state, answer, tests, SWE-smith's rule."""
    from ..sandbox import write_file
    from .evaluate import apply_patch

    meta = agent.reward.metadata
    timeout = agent.reward.eval_timeout
    deadline = time.monotonic() + timeout - min(5.0, timeout * 0.1)
    left = lambda: max(1.0, deadline - time.monotonic())  # noqa: E731
    workdir = shlex.quote(sandbox.workdir)
    state = await sandbox.exec(task_state_command(meta, sandbox.workdir), left())
    if state.exit_code != 0:
        raise RuntimeError(f"the task's bug_patch did not apply to the repository at {sandbox.workdir} (is this "
                           f"the image {meta.get('image_name') or '?'}?): {state.output[-1500:]}")
    if patch.strip():
        applied, attempts = await apply_patch(sandbox, workdir, patch, left)
        if applied is None:
            outcome.status, outcome.log_tail = VerificationStatus.PATCH_FAILED, attempts[-LOG_TAIL_CHARS:]
            outcome.error = f"the patch did not apply with any of: {'; '.join(GIT_APPLY_CMDS)}"
            return
    outcome.patch_applied = True
    files = dict.fromkeys(test_files(meta, "FAIL_TO_PASS") + test_files(meta, "PASS_TO_PASS"))
    if files:  # an answer does not get to change the tests that grade it
        reverts = " ; ".join(f"git checkout HEAD -- {shlex.quote(f)} 2>/dev/null" for f in files)
        await sandbox.exec(f"cd {workdir} && {{ {reverts} ; true ; }}", left())
    await write_file(sandbox, EVAL_SCRIPT_PATH, eval_script(meta, workdir).encode())
    run = await sandbox.exec(f"/bin/bash {EVAL_SCRIPT_PATH} 2>&1", left())
    outcome.log_tail = run.output[-LOG_TAIL_CHARS:]
    if run.timed_out:
        outcome.status = VerificationStatus.TIMEOUT
        outcome.error = f"the tests ran past the eval timeout ({timeout:g}s)"
        return
    grade = grade_log(meta, run.output)
    outcome.fail_to_pass, outcome.pass_to_pass = grade.fail_to_pass, grade.pass_to_pass
    outcome.resolved, outcome.reward = grade.resolved, 1.0 if grade.resolved else 0.0
    outcome.status = VerificationStatus.RESOLVED if grade.resolved else VerificationStatus.UNRESOLVED
    outcome.report = {"patch_is_None": False, "patch_exists": True, "patch_successfully_applied": True,
                      "resolved": grade.resolved, "tests_status": grade.tests_status}
    if not grade.tests_found:
        outcome.error = "the log has no test output between the harness's markers (graded as unresolved)"
