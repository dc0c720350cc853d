"""The `swe_smith` grader: SWE-smith instances (a bug injected into the source, per-repository images, no test
patch). The bug patch sets the task state, then SWE-smith's harness steps and grading rule, which live with the rest
of the SWE-smith knowledge (its rows, images and log parsers) in uni_agent/swebench/smith.py.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..swebench.smith import check_metadata, grade_swe_smith

if TYPE_CHECKING:
    from ..config import AgentConfig, RewardConfig
    from ..sandbox import Sandbox
    from ..verification import Verification


class SweSmithGrader:
    name = "swe_smith"
    required_metadata = ("instance_id", "repo", "patch", "FAIL_TO_PASS", "PASS_TO_PASS")
    solves_by_script = False

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        check_metadata(metadata)

    def time_limit(self, reward: RewardConfig, oracle: bool) -> float:
        return reward.eval_timeout

    async def grade(self, sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification,
                    oracle: bool) -> None:
        # This runs on the worker's event loop: the first import of `swebench` (seconds) happens in a thread.
        await asyncio.to_thread(importlib.import_module, "swebench.harness.grading")
        await grade_swe_smith(sandbox, agent, patch, outcome)
