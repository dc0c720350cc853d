"""What one rollout is given (RolloutSpec) and what it produces (RolloutResult): a typed record in the process, one
Parquet row at the driver's boundary (`row()`, whose columns uni_agent.driver.results.RESULT_SCHEMA names)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import AgentConfig
from ..fast_json import dumps_json, loads_json
from ..verification import Verification, VerificationStatus
from .exit_reason import ExitReason
from .failures import FailureKind, classify, infra

if TYPE_CHECKING:
    from .ending import Ending

_MESSAGES_TEXT = "_messages_text"  # the pickled conversation, before anything reads `messages` (RolloutResult)

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
    exit_reason: ExitReason
    messages: list[dict[str, Any]] = field(default_factory=list)  # the whole conversation, tool calls included
    patch: str = ""
    reward: float = 0.0
    resolved: bool = False
    masked: bool = False  # mask_abnormal_exit_traj: the trajectory should not be trained on (loss_mask all 0)
    mask_reason: str | None = None  # why `masked` (or why loss_mask is empty)
    failure_kind: FailureKind = FailureKind.NONE  # whose failure (uni_agent.episode.failures)
    failure_cause: str | None = None  # e.g. "max_turns", "unresolved", "sandbox: SandboxStartError: ..."
    num_turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    sandbox_start_s: float = 0.0
    llm_s: float = 0.0
    tools_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0
    verification: Verification | None = None  # None until graded (the row's "{}")
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
    token_drift: dict[str, Any] | None = None  # the turn whose prompt did not continue the sequence, and where
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
    attempts: list[dict[str, Any]] = field(default_factory=list)  # earlier rows replaced by --retry-errors
    # Harness rollouts (uni_agent.harness): where the token columns start a new chain and why, and how the program
    # ended (exit_code, timed_out, stopped, seconds, calls, refused_calls, output_tail). None for our own loop.
    chains: list[dict[str, Any]] | None = None
    harness: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        # a value read back or written by hand ("submitted") becomes its member; an unknown one is a ValueError
        self.exit_reason, self.failure_kind = ExitReason(self.exit_reason), FailureKind(self.failure_kind)

    @property
    def key(self) -> tuple[str, int]:
        return (self.instance_id, self.rollout)

    def row(self) -> dict[str, Any]:
        """The Parquet row: enums as their strings, the structured fields as JSON text."""
        row = dict(self.__dict__)
        row.pop(_MESSAGES_TEXT, None)
        row["exit_reason"], row["failure_kind"] = self.exit_reason.value, self.failure_kind.value
        row["messages"] = self.messages_text()
        row["verification"] = "{}" if self.verification is None else self.verification.to_json()
        row["attempts"] = json.dumps(self.attempts, ensure_ascii=False, default=str)
        row["token_drift"] = None if self.token_drift is None else json.dumps(self.token_drift)
        row["chains"] = None if self.chains is None else json.dumps(self.chains)
        row["harness"] = None if self.harness is None else json.dumps(self.harness, ensure_ascii=False)
        return row

    @classmethod
    def begin(cls, spec: RolloutSpec, agent_name: str, worker: str) -> RolloutResult:
        """The row of a rollout starting now, an error until its episode says how it ended."""
        return cls(run_id=spec.run_id, instance_id=spec.instance_id, rollout=spec.rollout,
                   data_source=spec.data_source, agent_name=agent_name, exit_reason=ExitReason.ERROR,
                   worker=worker, started_at=time.time())

    def end(self, ending: Ending) -> None:
        """Record how the episode ended: its exit reason, the error that ended it, the part that failed if one did."""
        self.exit_reason, self.error = ending.reason, ending.error
        if ending.failed is not None:
            infra(self, ending.failed, ending.error or ending.reason.value)

    def record(self, verification: Verification) -> None:
        """Take a verification's reward and settle whose failure the row is; a grading that failed to run also
        becomes the rollout's error."""
        self.reward, self.resolved = verification.reward, verification.resolved
        self.verify_s = verification.seconds
        self.verification = verification
        if verification.status in (VerificationStatus.ERROR, VerificationStatus.TIMEOUT) and self.error is None:
            self.error = f"verification {verification.status}: {verification.error}"
        classify(self)

    def messages_text(self) -> str:
        """The conversation as JSON text: as it crossed from the agent worker while no one has read `messages` here
        since (reading may change it), else encoded now, the same way."""
        if "messages" not in self.__dict__ and _MESSAGES_TEXT in self.__dict__:
            return self.__dict__[_MESSAGES_TEXT]
        return dumps_json(self.messages).decode()

    # A finished rollout crosses from its agent worker to the driver pickled, and the driver of a large run records
    # a wave's worth at once (issue 40). So the conversation crosses as one JSON text, encoded on the worker with
    # orjson: the driver writes that text to Parquet and to the page as it is, and parses it back into `messages`
    # only when something there reads the attribute. Unpickling the nested dicts was a third of the driver's CPU per
    # recorded row, and it encoded them twice (`uni-agent bench --record-only`).
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        if "messages" in state:
            state[_MESSAGES_TEXT] = dumps_json(state.pop("messages")).decode()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __getattr__(self, name: str) -> Any:  # only for attributes not set: `messages` not parsed yet
        text = self.__dict__.get(_MESSAGES_TEXT)
        if name != "messages" or text is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self.__dict__["messages"] = messages = loads_json(text)
        return messages

    def mask(self, reason: str) -> None:
        """Not to be trained on: loss_mask all 0, and why."""
        self.masked, self.mask_reason = True, reason
        self.loss_mask = [0] * len(self.loss_mask)


class RolloutRaised(RuntimeError):
    """A rollout's episode raised inside a live agent worker (a fault of the code, not an ending); the message is
    "<type>: <message>"."""


@dataclass(frozen=True)
class Finished:
    """A rollout that came back from its agent worker with its row (the actor's _OK)."""

    key: tuple[str, int]
    result: RolloutResult

    def unwrap(self) -> RolloutResult:
        return self.result


@dataclass(frozen=True)
class Raised:
    """A rollout whose episode raised on its agent worker (the actor's _Error): the error crosses as text, since
    an exception of any class may not unpickle on the driver."""

    key: tuple[str, int]
    error: str

    def unwrap(self) -> RolloutResult:
        raise RolloutRaised(self.error)


Outcome = Finished | Raised  # what AgentWorker.collect returns per rollout


@dataclass(frozen=True)
class Batch:
    """Specs or outcomes crossing between the driver and an agent worker as one pickle. Dask serializes a list
    argument or reply item by item (a header and frames for each, and every spec pickled its AgentConfig again):
    handing 20,000 specs out that way was a quarter of the driver's lead-in (issue 40)."""

    items: list[Any]
