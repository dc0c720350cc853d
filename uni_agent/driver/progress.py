"""What a watcher sees of a run: the terminal line (tqdm) and the rollout events the dashboard page reads (sent to the
scheduler's event log; the dashboard is never worth a rollout, so a lost event is only logged)."""

from __future__ import annotations

import json
import sys
from typing import Any

import structlog
from distributed import Client

from ..events import MAX_TRAJECTORY_CHARS, TOPIC, batch_event, rollout_event
from ..episode.rollout import RolloutResult, RolloutSpec

log = structlog.get_logger("uni_agent.driver")
QUEUED_PER_MESSAGE = 1000  # `queued` events sent in one message (one round trip to the scheduler each)


class Progress:
    """The terminal line: done/total, ETA and rate (tqdm), plus rollouts running now, mean reward so far, errors."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar: Any = None
        self.done = self.errors = self.running = 0
        self.reward_sum = 0.0

    def start(self, total: int) -> None:
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="rollout", file=sys.stderr, dynamic_ncols=True)

    def started(self) -> None:
        self.running += 1
        self._show()

    def update(self, result: RolloutResult) -> None:
        self.running -= 1
        self.done += 1
        self.reward_sum += result.reward
        self.errors += result.exit_reason == "error"
        if self.bar is not None:
            self.bar.update(1)
        self._show()

    def _show(self) -> None:
        if self.bar is not None:
            reward = f"{self.reward_sum / self.done:.3f}" if self.done else "-"
            self.bar.set_postfix(running=self.running, reward=reward, errors=self.errors)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class RolloutEvents:
    """Each rollout's states (queued, started by the worker, verifying, done or failed) for the dashboard page."""

    def __init__(self, client: Client):
        self.client = client

    async def queued(self, todo: list[RolloutSpec]) -> None:
        for start in range(0, len(todo), QUEUED_PER_MESSAGE):
            events = [rollout_event(s.run_id, s.instance_id, s.rollout, "queued",
                                    max_turns=s.agent.interaction.max_turns)
                      for s in todo[start:start + QUEUED_PER_MESSAGE]]
            await self._send(batch_event(events))

    async def state(self, spec: RolloutSpec, state: str, **fields: Any) -> None:
        await self._send(rollout_event(spec.run_id, spec.instance_id, spec.rollout, state, **fields))

    async def finished(self, spec: RolloutSpec, result: RolloutResult) -> None:
        await self.state(spec, "failed" if result.exit_reason == "error" else "done", **final_fields(result))

    async def _send(self, event: Any) -> None:
        try:
            await self.client.log_event(TOPIC, event)
        except Exception as exc:  # the dashboard is not worth a rollout
            log.warning("event_dropped", error=repr(exc))


def final_fields(result: RolloutResult) -> dict[str, Any]:
    """What the dashboard shows of a finished rollout (the trajectory clipped; the full one is in Parquet)."""
    fields = {k: getattr(result, k) for k in (
        "reward", "resolved", "exit_reason", "num_turns", "prompt_tokens", "completion_tokens", "sandbox_start_s",
        "llm_s", "tools_s", "verify_s", "total_s", "worker", "error")}
    fields["error_kind"] = result.error.split(":", 1)[0] if result.error else None
    fields["messages"] = clip_messages(result.messages, MAX_TRAJECTORY_CHARS)
    fields["verification"] = result.verification[:MAX_TRAJECTORY_CHARS]
    return fields


def clip_messages(messages_json: str, limit: int) -> str:
    """The trajectory as valid JSON within `limit` characters: the first messages that fit, then a note."""
    if len(messages_json) <= limit:
        return messages_json
    kept, size = [], 0
    messages = json.loads(messages_json)
    for message in messages:
        size += len(json.dumps(message, ensure_ascii=False)) + 2
        if size > limit - 200:
            break
        kept.append(message)
    kept.append({"role": "note", "content": f"{len(messages) - len(kept)} later messages are in the Parquet results"})
    return json.dumps(kept, ensure_ascii=False)
