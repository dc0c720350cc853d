"""The `swe_bench` grader: SWE-bench instances (and SWE-Gym / SWE-rebench rows, which carry their own test spec)
graded with the official eval script, log parsers and resolution rule of the `swebench` package.

The harness steps themselves live with the rest of the SWE-bench knowledge in uni_agent/swebench/ (evaluate.py,
grading.py, spec.py: one place pinned to swebench 4.1.0); this module turns their outcome into a Verification.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..swebench.evaluate import evaluate_patch
from ..swebench.spec import log_parser, repo_spec
from .grader import LOG_TAIL_CHARS

if TYPE_CHECKING:
    from ..config import AgentConfig, RewardConfig
    from ..sandbox import Sandbox
    from ..verification import Verification


class SweBenchGrader:
    name = "swe_bench"
    required_metadata = ("instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS",
                         "PASS_TO_PASS")
    solves_by_script = False

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        repo_spec(metadata)  # the swebench package is installed and knows this repo/version (or the row carries
        log_parser(metadata)  # its own spec), and the log parser exists

    def time_limit(self, reward: RewardConfig, oracle: bool) -> float:
        return reward.eval_timeout

    async def grade(self, sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification,
                    oracle: bool) -> None:
        evaluation = await evaluate_patch(sandbox, agent.reward.metadata, patch, agent.reward.eval_timeout)
        outcome.status, outcome.patch_applied = evaluation.status, evaluation.patch_applied
        outcome.log, outcome.log_tail = evaluation.log, evaluation.log[-LOG_TAIL_CHARS:]
        outcome.report = evaluation.report
        if evaluation.grade is not None:
            outcome.fail_to_pass = evaluation.grade.fail_to_pass
            outcome.pass_to_pass = evaluation.grade.pass_to_pass
            outcome.resolved = evaluation.grade.resolved
            outcome.reward = 1.0 if outcome.resolved else 0.0
        if evaluation.notes:
            outcome.error = "; ".join(evaluation.notes)
