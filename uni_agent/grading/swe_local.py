"""The `swe_local` grader: bundled and user tasks in SWE-bench form, graded with pytest and our log parser.

Steps (the SWE-bench harness's order): apply the model's patch → reset the files the test patch touches (an
add-only test patch included) → apply the hidden test patch → run the tests → parse the log → grade.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..sandbox import write_file
from ..tasks.rows import test_list
from ..verification import VerificationStatus
from .grader import LOG_TAIL_CHARS
from .pytest_log import files_in_patch, grade, parse_pytest_log

if TYPE_CHECKING:
    from ..config import AgentConfig, RewardConfig
    from ..sandbox import Sandbox
    from ..verification import Verification

DEFAULT_TEST_CMD = "python -m pytest -rA -p no:cacheprovider -q"


class SweLocalGrader:
    name = "swe_local"
    required_metadata = ("test_patch", "FAIL_TO_PASS", "PASS_TO_PASS")
    solves_by_script = False

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        pass  # the test lists are checked for every grader that needs them (registry.check_reward_config)

    def time_limit(self, reward: RewardConfig, oracle: bool) -> float:
        return reward.eval_timeout

    async def grade(self, sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification,
                    oracle: bool) -> None:
        meta = agent.reward.metadata
        test_patch: str = meta["test_patch"]
        timeout = agent.reward.eval_timeout
        workdir = shlex.quote(sandbox.workdir)
        if patch.strip():
            await write_file(sandbox, "/tmp/model.patch", patch.encode())
            applied = await sandbox.exec(f"cd {workdir} && git apply --whitespace=nowarn /tmp/model.patch", timeout)
            if applied.exit_code != 0:
                outcome.status, outcome.log_tail = VerificationStatus.PATCH_FAILED, applied.output[-LOG_TAIL_CHARS:]
                return
        outcome.patch_applied = True
        f2p = test_list(meta["FAIL_TO_PASS"], "FAIL_TO_PASS")
        p2p = test_list(meta["PASS_TO_PASS"], "PASS_TO_PASS")
        test_id_files = list(dict.fromkeys(t.split("::")[0] for t in f2p + p2p))
        # An empty test_patch means no test changes: the tests are already in the repository (SWE-smith's tasks).
        has_test_patch = bool(test_patch.strip())
        # The agent may have edited or created the test files; reset them so only the reference tests count: those
        # the test patch touches, or (no test patch) the files of the FAIL_TO_PASS / PASS_TO_PASS tests, as
        # SWE-smith's harness reverts changes to them.
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
            outcome.status = VerificationStatus.TIMEOUT
            return
        result = grade(f2p, p2p, parse_pytest_log(log))
        outcome.fail_to_pass, outcome.pass_to_pass = result.fail_to_pass, result.pass_to_pass
        outcome.resolved, outcome.reward = result.resolved, result.reward
        outcome.status = VerificationStatus.RESOLVED if result.resolved else VerificationStatus.UNRESOLVED
