"""What a grader is: the protocol every reward type (`reward.name`) implements, found by name in grader_names.py.

A grader says which `reward.metadata` keys a row needs (checked before anything runs), how long grading may take,
and grades an answer in a running sandbox. `grade` fills the Verification it is handed rather than returning a new
one: when the time limit cancels it, what it learned first (the patch applied, the log so far) is kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config import AgentConfig, RewardConfig
    from ..sandbox import Sandbox
    from ..verification import Verification

LOG_TAIL_CHARS = 8000  # how much of a test log a Verification keeps


class Grader(Protocol):
    name: str
    """The `reward.name` rows use to pick this grader."""
    required_metadata: tuple[str, ...]
    """The `reward.metadata` keys every row of this grader carries."""
    solves_by_script: bool
    """The task's reference answer is a script run in the sandbox (Terminal-Bench's solution/solve.sh), not a
    gold `patch` in the metadata."""

    def check_metadata(self, metadata: Mapping[str, Any]) -> None:
        """Further checks on a row's metadata (ConfigError saying what is wrong); the required keys are there."""

    def time_limit(self, reward: RewardConfig, oracle: bool) -> float:
        """Seconds grading may take once the sandbox is up (`oracle`: the reference script runs first)."""

    async def grade(self, sandbox: Sandbox, agent: AgentConfig, patch: str, outcome: Verification,
                    oracle: bool) -> None:
        """Grade in a running sandbox: apply `patch` (empty: the changes are in place or there are none) or run the
        reference script (`oracle`), run the tests, fill `outcome`. A failure may raise: the caller records it."""
