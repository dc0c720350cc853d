"""What a watcher sees of a run: the terminal line (tqdm) and the rollout events the dashboard page reads (sent to the
scheduler's event log; the dashboard is never worth a rollout, so a lost event is only logged)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any

import structlog
from distributed import Client

from ..events import MAX_TRAJECTORY_CHARS, TOPIC, batch_event, notice_event, rollout_event, trim_trajectories
from ..episode.rollout import RolloutResult, RolloutSpec

log = structlog.get_logger("uni_agent.driver")
PER_MESSAGE = 1000  # events in one message to the scheduler (one round trip each)
MESSAGE_CHARS = 8_000_000  # trajectory text in one message: 40 full-size trajectories (MAX_TRAJECTORY_CHARS)
FLUSH_S = 0.2  # how long an event may wait in the driver's outbox
# Messages on their way at once: while the scheduler folds one, the driver packs the next (one at a time, a wave's end
# waited for the sum of both). They may arrive out of order: the page's fold orders each rollout's events by their
# own time (uni_agent.dashboard.state).
SENDS_IN_FLIGHT = 3


def run_phase(phase: str, **fields: Any) -> None:
    """A step of the run's start or end in the driver's log (event `run_phase`, with its timestamp): where a large
    run's lead-in and tail go, phase by phase (`uni-agent bench --simulate` prints them)."""
    log.info("run_phase", phase=phase, **fields)


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
    """Each rollout's states (queued, started by the worker, verifying, done or failed) for the dashboard page.

    `client.log_event` is a round trip to the scheduler, and a wave's rollouts finish together: one call per finished
    rollout saturated the driver's connection pool at 20,000 in flight and put 16 s between the last finished rollout
    and the last recorded one. So no rollout waits for its event: `state` and `finished` only put it in an outbox, and
    one task sends what gathered every `flush_s` as batch events (at most PER_MESSAGE events or MESSAGE_CHARS of
    trajectory text each). `close` sends what is left."""

    def __init__(self, client: Client, flush_s: float = FLUSH_S):
        self.client, self.flush_s = client, flush_s
        self.outbox: list[dict[str, Any]] = []
        self.sent_messages = 0
        self._wake = asyncio.Event()
        self._sender: asyncio.Task[None] | None = None
        self._on_their_way: set[asyncio.Future[None]] = set()  # messages being sent, whichever flush sent them
        self._at_once = False  # the send loop's next pass goes without waiting flush_s

    def queued(self, todo: list[RolloutSpec]) -> None:
        """Sent like every other event: the rollouts start while they travel (awaited, 100,000 of them held the
        first start back 0.6-1.1 s). A worker's `starting_sandbox` that arrives first is folded first; the page takes
        the late `queued` for what it adds (uni_agent.dashboard.state)."""
        self.outbox.extend(rollout_event(s.run_id, s.instance_id, s.rollout, "queued",
                                         max_turns=s.agent.interaction.max_turns) for s in todo)
        self._post_pending(at_once=True)  # ahead of the hand-out: in a small run they always arrive first

    def state(self, spec: RolloutSpec, state: str, **fields: Any) -> None:
        self._post(rollout_event(spec.run_id, spec.instance_id, spec.rollout, state, **fields))

    def notice(self, run_id: str, level: str, message: str) -> None:
        """A run-level message for the page (an engine restart, results that cannot be written)."""
        self._post(notice_event(run_id, level, message))

    def _post(self, event: dict[str, Any]) -> None:
        self.outbox.append(event)
        self._post_pending()

    def _post_pending(self, at_once: bool = False) -> None:
        """The send loop, woken (started on the first event): it sends the outbox a flush_s later, or `at_once`."""
        self._at_once = self._at_once or at_once
        if self._sender is None:
            self._sender = asyncio.ensure_future(self._send_loop())
        self._wake.set()

    def finished(self, spec: RolloutSpec, result: RolloutResult) -> None:
        self.state(spec, "failed" if result.exit_reason == "error" else "done", **final_fields(result))

    async def _send_loop(self) -> None:
        while True:
            await self._wake.wait()
            if not self._at_once:
                await asyncio.sleep(self.flush_s)  # let a burst (a wave finishing) gather into few messages
            self._wake.clear()
            self._at_once = False
            await self.flush()

    async def flush(self) -> None:
        """Send everything in the outbox now, in as few messages as the limits allow, at most SENDS_IN_FLIGHT on their
        way at once; of the finished rollouts in it, only the trajectories the page will keep
        (events.trim_trajectories). Returns once every message on its way, whichever flush sent it, has arrived."""
        while self.outbox:
            pending, self.outbox = self.outbox, []  # what arrives while these are sent goes in the next pass
            trim_trajectories(pending)
            try:
                while pending:
                    while len(self._on_their_way) >= SENDS_IN_FLIGHT:
                        await asyncio.wait(set(self._on_their_way), return_when=asyncio.FIRST_COMPLETED)
                    take = message_size(pending)
                    batch, pending = pending[:take], pending[take:]
                    message = asyncio.ensure_future(self._send(batch_event(batch)))
                    message.add_done_callback(self._on_their_way.discard)
                    self._on_their_way.add(message)
            finally:
                self.outbox[:0] = pending  # not sent (the send loop cancelled by close): first for close's flush
                # (a message already on its way goes on by itself: cancelled halfway, it could arrive or not)
        if self._on_their_way:  # close's flush: also those the send loop it cancelled had sent
            await asyncio.wait(set(self._on_their_way))

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(BaseException):
                await self._sender
            self._sender = None
        await self.flush()

    async def _send(self, event: Any) -> None:
        try:
            # The scheduler's `log_event` call itself, not Client.log_event: that first walks the whole message in
            # Python to check msgpack can take it (distributed's _is_dumpable), ~2-3 us of the driver's CPU a
            # finished rollout's event (6.3 -> 4.0 us sent, `bench --record-only`), on its loop while a wave's rows
            # arrive. Every event is made of plain msgpack values where it is built (events.plain_value).
            await self.client.scheduler.log_event(topic=TOPIC, msg=event)
            self.sent_messages += 1
        except Exception as exc:  # the dashboard is not worth a rollout
            log.warning("event_dropped", error=repr(exc), events=len(event.get("events", [])))


def message_size(events: list[dict[str, Any]]) -> int:
    """How many of the first events go in one message: at most PER_MESSAGE, and no more trajectory text than
    MESSAGE_CHARS (a finished rollout carries up to MAX_TRAJECTORY_CHARS of it); always at least one."""
    chars = 0
    for i, event in enumerate(events[:PER_MESSAGE]):
        chars += len(event.get("messages") or "") + len(event.get("verification") or "")
        if chars > MESSAGE_CHARS and i > 0:
            return i
    return min(len(events), PER_MESSAGE)


def final_fields(result: RolloutResult) -> dict[str, Any]:
    """What the dashboard shows of a finished rollout (the trajectory clipped; the full one is in Parquet)."""
    fields = {k: getattr(result, k) for k in (
        "reward", "resolved", "exit_reason", "num_turns", "prompt_tokens", "completion_tokens", "sandbox_start_s",
        "llm_s", "tools_s", "verify_s", "total_s", "worker", "error")}
    fields["error_kind"] = result.error.split(":", 1)[0] if result.error else None
    fields["messages"] = clip_messages(result.messages_text(), MAX_TRAJECTORY_CHARS)
    verification = "{}" if result.verification is None else result.verification.to_json()
    fields["verification"] = verification[:MAX_TRAJECTORY_CHARS]
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
