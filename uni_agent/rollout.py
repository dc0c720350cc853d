"""What one rollout is given (RolloutSpec) and what it produces (RolloutResult, one Parquet row)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .config import AgentConfig

if TYPE_CHECKING:
    from .verify import Verification

ExitReason = Literal["submitted", "max_turns", "context_limit", "timeout_budget", "error"]
EXIT_REASONS: tuple[str, ...] = ("submitted", "max_turns", "context_limit", "timeout_budget", "error")


@dataclass(frozen=True)
class RolloutSpec:
    run_id: str
    instance_id: str
    rollout: int
    data_source: str
    row_index: int
    prompt: list[dict[str, Any]]
    agent: AgentConfig
    grade_in_sandbox: bool = False  # the agent loop grades before closing its sandbox (reward.in_agent_sandbox)

    @property
    def key(self) -> tuple[str, int]:
        return (self.instance_id, self.rollout)


@dataclass
class RolloutResult:
    run_id: str
    instance_id: str
    rollout: int
    data_source: str
    agent_name: str
    exit_reason: str
    messages: str = "[]"  # JSON: the whole conversation, tool calls and observations included
    patch: str = ""
    reward: float = 0.0
    resolved: bool = False
    masked: bool = False  # mask_abnormal_exit_traj: the trajectory should not be trained on
    num_turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sandbox_start_s: float = 0.0
    llm_s: float = 0.0
    tools_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    verification: str = "{}"  # JSON: patch_applied, per-test status, log tail
    error: str | None = None
    worker: str = ""
    started_at: float = 0.0
    finished_at: float = 0.0

    def row(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def record(self, verification: Verification) -> None:
        """Take a verification's reward; a grading that failed to run also becomes the rollout's error."""
        self.reward, self.resolved = verification.reward, verification.resolved
        self.verify_s = verification.seconds
        self.verification = verification.to_json()
        if verification.status in ("error", "timeout") and self.error is None:
            self.error = f"verification {verification.status}: {verification.error}"
