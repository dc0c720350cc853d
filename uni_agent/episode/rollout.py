"""What one rollout is given (RolloutSpec) and what it produces (RolloutResult, one Parquet row)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import AgentConfig
from ..grading.verification import VerificationStatus
from .exit_reason import ExitReason

if TYPE_CHECKING:
    from ..grading.verification import Verification

# Whose failure a row is (uni_agent.episode.failures): none (resolved), the model's, or the infrastructure's.
FAILURE_KINDS: tuple[str, ...] = ("none", "model", "infra")
# Columns holding one list per row (Parquet list<int32> / list<float32>); everything else is a scalar.
TOKEN_COLUMNS: dict[str, str] = {"input_ids": "int32", "loss_mask": "int32", "logprobs": "float32",
                                 "token_versions": "int32"}


@dataclass(frozen=True)
class RolloutSpec:
    run_id: str
    instance_id: str
    rollout: int
    data_source: str
    row_index: int
    prompt: list[dict[str, Any]]
    agent: AgentConfig
    grade_in_agent_sandbox: bool = False  # reward.in_agent_sandbox, verify on: the loop grades before it closes

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
    exit_reason: str  # an ExitReason's value (a plain string: the Parquet column and the events carry it)
    messages: str = "[]"  # JSON: the whole conversation, tool calls and observations included
    patch: str = ""
    reward: float = 0.0
    resolved: bool = False
    masked: bool = False  # mask_abnormal_exit_traj: the trajectory should not be trained on (loss_mask all 0)
    mask_reason: str | None = None  # why `masked` (or why loss_mask is empty)
    failure_kind: str = "none"  # none | model | infra (uni_agent.episode.failures)
    failure_cause: str | None = None  # e.g. "max_turns", "unresolved", "sandbox: SandboxStartError: ..."
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
    # The training sequence (uni_agent.episode.trajectory): every model call's prompt and completion tokens as the
    # engine reported them, 1 in loss_mask on sampled tokens, each sampled token's logprob (0 elsewhere). Empty when the
    # engine gave no token ids (token_source says which engine protocol filled them).
    input_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_source: str = ""  # llama_server | vllm | "" (none asked for)
    tokens_missing: str | None = None  # why the token columns are empty although token_source was asked for
    token_drift: str | None = None  # JSON: the turn whose prompt did not continue the sequence, and where
    # Policy versions (uni_agent.online): the version of the weights that sampled each token (-1 on tokens no model
    # sampled; aligned with input_ids), the least and greatest of them (-1: none), the trainer's step and the version
    # it asked for. A plain run is step 0 on version 0.
    token_versions: list[int] = field(default_factory=list)
    version_min: int = -1
    version_max: int = -1
    step: int = 0
    policy_version: int = 0
    staleness_action: str | None = None  # max_staleness: masked | restarted (uni_agent.online.staleness)
    stale_restarts: int = 0  # runs of this rollout dropped as too stale before this one
    attempts: str = "[]"  # JSON: earlier attempts of this rollout replaced by --retry-errors (oldest first)
    # Harness rollouts (uni_agent.harness): where the token columns start a new chain and why (JSON list), and how
    # the program ended (JSON: exit_code, timed_out, stopped, seconds, calls, output_tail). None for our own loop.
    chains: str | None = None
    harness: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.instance_id, self.rollout)

    def row(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def begin(cls, spec: RolloutSpec, agent_name: str, worker: str) -> RolloutResult:
        """The row of a rollout starting now, an error until its episode says how it ended."""
        return cls(run_id=spec.run_id, instance_id=spec.instance_id, rollout=spec.rollout,
                   data_source=spec.data_source, agent_name=agent_name, exit_reason=ExitReason.ERROR.value,
                   worker=worker, started_at=time.time())

    def end(self, reason: ExitReason, error: str | None = None) -> None:
        """Record why the episode ended, and the error that ended it."""
        self.exit_reason, self.error = ExitReason(reason).value, error

    def record(self, verification: Verification) -> None:
        """Take a verification's reward; a grading that failed to run also becomes the rollout's error."""
        self.reward, self.resolved = verification.reward, verification.resolved
        self.verify_s = verification.seconds
        self.verification = verification.to_json()
        if verification.status in (VerificationStatus.ERROR, VerificationStatus.TIMEOUT) and self.error is None:
            self.error = f"verification {verification.status}: {verification.error}"
