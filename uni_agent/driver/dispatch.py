"""The dispatch loop: every rollout to an agent worker (bounded by its agent's `concurrency`), each finished one
verified as a Dask future and recorded. What to do at each turn (which actor, retry, replace, give up) is the
DispatchPolicy's decision (uni_agent.driver.policy); this module only carries it out: actor calls, scheduler
queries, actor starts, verification futures, events."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import structlog
from distributed import Client

from ..episode.ending import Ending
from ..episode.exit_reason import ExitReason
from ..episode.failures import FailedPart
from ..events import RolloutState
from ..redact import redact
from .results import ResultStore
from ..episode.rollout import RolloutResult, RolloutSpec
from ..settings import RunSettings
from ..grading import Verification, verify_patch
from ..verification import VerificationStatus, no_result
from .cluster import sandbox_workers
from .mailbox import ActorUnreachable, Mailboxes
from .pacing import StartPacer
from .policy import DispatchPolicy, Enough, GiveUp, NeedActor, NoWorkerCameBack, Replace, Send, StartActor
from .pool import ActorPool
from .progress import Progress, RolloutEvents, run_phase

log = structlog.get_logger("uni_agent.driver")
WRITE_RETRY_S = 5.0  # while results cannot be written, how often the dispatcher tries again
# Rollout tasks made at a time at a run's start. All at once, every one of them took its first step before the event
# loop came back to anything else: the first hand-out to a worker waited for all of them (1.1-1.5 s at 100,000).
START_SLICE = 1000
VERIFY_MARGIN_S = 120  # on top of the grader's own bounds: a verification future that never reports gives up then
UNREACHABLE_PAUSE_S = 1.0  # an unreachable actor whose worker the scheduler still lists: it is most often dying, and
# the scheduler says so a moment later; sent again at once, the rollout would only fail on it again


class AgentWorkersLost(RuntimeError):
    """Every agent worker was lost and no dask worker came back to host new ones. The results recorded so far are
    on disk; the rollouts that did not finish are not recorded, so a rerun with the same output dir runs them."""


class Dispatcher:
    def __init__(self, client: Client, pool: ActorPool, policy: DispatchPolicy, store: ResultStore,
                 settings: RunSettings, placement: dict[str, Any]):
        self.client, self.pool, self.policy, self.store, self.settings = client, pool, policy, store, settings
        self.placement = placement  # where verification futures go (cluster.verification_placement)
        self.limits: dict[str, asyncio.Semaphore] = {}  # agent name -> its `concurrency`
        self.pacer = StartPacer(settings.start_rate)  # starts spaced, not all at once (pacing.py)
        self.progress = Progress(settings.progress)
        self.events = RolloutEvents(client)
        self.not_run: list[RolloutSpec] = []  # rollouts left when every agent worker was lost
        self.not_started: list[RolloutSpec] = []  # rollouts not started because results could not be written
        self._writes = asyncio.Lock()  # one retry loop for every rollout waiting to start
        self._write_failure_said = False
        self._gave_up = False  # writes failed for write_retry_timeout: no rollout starts any more
        self.run_id = ""
        self.mailboxes = Mailboxes()  # rollouts go to actors in batches, not one actor call each
        # The recorded-rollout line's logger, bound once: the module's proxy binds anew on each call (~2 us of the
        # line's ~9 on the 2-core VM); made here, after the run configured its logging.
        self._record_log = log.bind()
        self._replacing = asyncio.Lock()
        self._flush_timer: asyncio.TimerHandle | None = None  # many rollouts notice the same loss at once: replace once
        # After each run of a rollout, before it is verified and recorded: True runs it again (the online service's
        # staleness bound, uni_agent.online.service); it may also fill in the row (step, versions, masking).
        self.review: Callable[[RolloutSpec, RolloutResult], bool] | None = None

    async def close(self) -> None:
        """At the session's end: the page's last events and the agent workers' close, together (neither waits for the
        other; at 100,000 rollouts the end went 1.12 -> 0.90 s on one host and stayed 1.4 s on another, as the
        actors' close calls pass through the scheduler that folds those events)."""
        async def events_sent() -> None:
            await self.events.close()
            run_phase("events_sent")

        async def actors_closed() -> None:
            await self.pool.close()
            run_phase("agent_workers_closed")
        await asyncio.gather(events_sent(), actors_closed())

    async def start_actors(self, workers: list[str]) -> None:
        """All at once: an actor's start is its worker importing the agent loop (a second or two), and one after
        another that held every rollout back by ten or more seconds on ten workers."""
        started = await asyncio.gather(*(self.pool.start_actor(w) for w in self.policy.initial_workers(workers)),
                                       return_exceptions=True)
        for actor in started:
            if not isinstance(actor, BaseException):
                self.policy.actor_started(actor.name, actor.worker)
        for failed in (a for a in started if isinstance(a, BaseException)):
            raise failed

    async def run(self, todo: list[RolloutSpec]) -> None:
        self.run_id = todo[0].run_id if todo else ""
        self.progress.start(len(todo))
        self.events.queued(todo)
        run_phase("queued", rollouts=len(todo))
        try:
            await self._run_all(todo)
        finally:
            run_phase("rollouts_finished")
            self.progress.close()
            await self.mailboxes.close()
            self._flush_now(every_row=True)  # the last rows to disk now, while the page's last events travel
        # the events still on their way arrive while the agent workers close: the session closes both (close)
        self.store.not_started = len(self.not_started)
        if self.not_run:
            raise AgentWorkersLost(
                f"every agent worker was lost and no dask worker came back within {self.settings.worker_wait_timeout:g}"
                f" s: {len(self.not_run)} of {len(todo)} rollouts did not finish and are not recorded; rerun with the "
                "same output dir to run them")

    async def _run_all(self, todo: list[RolloutSpec]) -> None:
        """run_one for every spec, their tasks made START_SLICE at a time: each slice's first steps (and the hand-out
        they lead to) run before the next slice is made."""
        tasks: list[asyncio.Future[RolloutResult | None]] = []
        try:
            for start in range(0, len(todo), START_SLICE):
                tasks += [asyncio.ensure_future(self.run_one(spec)) for spec in todo[start:start + START_SLICE]]
                await asyncio.sleep(0)
        except BaseException:  # cancelled while making them: none is left running
            for task in tasks:
                task.cancel()
            raise
        await asyncio.gather(*tasks)

    def _flush_later(self) -> None:
        """Rows the store held back (it writes at most one part file a flush_s) go to disk a flush_s later."""
        if self._flush_timer is None and self.store.flush_due():
            self._flush_timer = asyncio.get_running_loop().call_later(self.store.flush_s, self._flush_now)

    def _flush_now(self, every_row: bool = False) -> None:
        if self._flush_timer is not None:
            self._flush_timer.cancel()  # (a no-op when it is the timer calling)
        self._flush_timer = None
        if every_row or self.store.flush_due():
            self.store.flush()
            self._say_write_state()

    async def run_one(self, spec: RolloutSpec) -> RolloutResult | None:
        """One rollout: run (again while `review` asks), verified, recorded; None when no agent worker was left."""
        limit = self.limits.setdefault(spec.agent.name, asyncio.Semaphore(spec.agent.concurrency))
        async with limit:
            if not await self._results_writable():
                self.not_started.append(spec)
                return None
            await self.pacer.wait()
            self.progress.started()
            if self.settings.verify and spec.agent.reward.in_agent_sandbox:
                spec = dataclasses.replace(spec, grade_in_agent_sandbox=True)
            try:
                result = await self._rollout(spec)
                while self.review is not None and self.review(spec, result):
                    result = await self._rollout(spec)
            except AgentWorkersLost:
                self.policy.rollout_abandoned(spec.key)
                self.not_run.append(spec)
                self.events.state(spec, RolloutState.FAILED, error="every agent worker was lost",
                                  exit_reason=ExitReason.ERROR)
                return None
            if self.settings.verify and not spec.grade_in_agent_sandbox:
                self.events.state(spec, RolloutState.VERIFYING, worker=result.worker)
                await self._verify(spec, result)
        self.store.add(result)
        self._flush_later()
        self._say_write_state()
        self.events.finished(spec, result)
        self.progress.update(result)
        self._record_log.info("rollout_recorded", instance_id=spec.instance_id, rollout=spec.rollout,
                              reward=result.reward, exit_reason=result.exit_reason)
        return result

    async def _results_writable(self) -> bool:
        """While finished results cannot be written (a full disk) no rollout starts: its result could only wait in
        memory too. The write is retried every WRITE_RETRY_S; True once it succeeds, False when it kept failing for
        `write_retry_timeout` (then no rollout starts any more, and the run ends once those in flight finish)."""
        async with self._writes:
            while self.store.write_error is not None and not self._gave_up:
                if time.monotonic() - (self.store.failing_since or 0) > self.settings.write_retry_timeout:
                    self._gave_up = True
                    self._say(f"results could not be written for {self.settings.write_retry_timeout:g} s: no more "
                              f"rollouts start; the run ends once the {self.progress.running} in flight finish")
                    break
                await asyncio.sleep(WRITE_RETRY_S)
                self.store.flush()
                self._say_write_state()
        return not self._gave_up

    def _say_write_state(self) -> None:
        """Say on stderr, in the log and on the dashboard page when results stop being written, and when they are
        written again."""
        failing, said = self.store.write_error is not None, self._write_failure_said
        if failing and not said:
            self._say(f"results cannot be written to {self.store.dir}: {self.store.write_error}; {self.store.waiting} "
                      f"finished rollouts wait in memory, and no new rollout starts until a write succeeds (tried "
                      f"again every {WRITE_RETRY_S:g} s, for up to {self.settings.write_retry_timeout:g} s)")
        elif said and not failing:
            self._say(f"results written again to {self.store.dir}", level="warning")
        self._write_failure_said = failing

    def _say(self, message: str, level: str = "error") -> None:
        getattr(log, level)("results_write_state", message=message, waiting=self.store.waiting)
        print(message, file=sys.stderr)
        self.events.notice(self.run_id, level, message)

    async def _rollout(self, spec: RolloutSpec) -> RolloutResult:
        while True:
            step = self.policy.next_step(spec.key)
            if isinstance(step, GiveUp):
                lost = RolloutResult.begin(spec, spec.agent.name, worker="")
                lost.end(Ending(ExitReason.ERROR, f"agent worker failed: {step.error}", FailedPart.WORKER))
                return lost
            if isinstance(step, NeedActor):
                if not await self._replace(None):
                    raise AgentWorkersLost()
                continue
            assert isinstance(step, Send)
            try:
                result = await self.mailboxes.run(self.pool.handle(step.actor), spec)
            except asyncio.CancelledError:  # its caller cancelled it (the online service): no longer in flight
                self.policy.rollout_done(spec.key, step.actor)
                raise
            except Exception as exc:  # the actor, its worker or the rollout inside failed: the policy says what next
                error = redact(f"{type(exc).__name__}: {exc}")
                unreachable = isinstance(exc, ActorUnreachable)  # an interrupted rollout, not a failed one
                log.warning("actor_call_failed", instance_id=spec.instance_id, rollout=spec.rollout, error=error,
                            unreachable=unreachable)
                decision = self.policy.call_failed(spec.key, step.actor, error, await self.pool.live_workers(),
                                                   unreachable=unreachable)
                if isinstance(decision, Replace) and not await self._replace(decision.actor):
                    raise AgentWorkersLost() from exc
                if unreachable and not isinstance(decision, Replace):
                    await asyncio.sleep(UNREACHABLE_PAUSE_S)
                continue
            self.policy.rollout_done(spec.key, step.actor)
            return result

    async def _replace(self, lost: str | None) -> bool:
        """Drop a lost actor (and any other whose worker is gone) and start a replacement, as the policy decides;
        False when no actor is left and no worker came back within `worker_wait_timeout`."""
        async with self._replacing:
            for name in self.policy.drop(lost, await self.pool.live_workers()):
                actor = self.pool.drop(name)
                log.warning("agent_worker_lost", worker=actor.worker if actor else "",
                            actors_left=len(self.policy.placed))
            if self.policy.enough_actors():
                return True
            self.policy.replacement_begins(time.monotonic())
            while True:
                workers: list[str] = []
                with contextlib.suppress(RuntimeError):  # RuntimeError: no worker can take sandboxes (yet)
                    workers = await sandbox_workers(self.client, self.settings.gpu_resource_name)
                step = self.policy.replacement_step(workers, time.monotonic())
                if isinstance(step, StartActor):
                    try:
                        actor = await self.pool.start_actor(step.worker, step.timeout)
                    except Exception:  # the worker may die before the actor is up
                        step = self.policy.start_failed(time.monotonic())
                    else:
                        self.policy.actor_started(actor.name, actor.worker)
                        log.warning("agent_worker_replaced", worker=actor.worker)
                        return True
                if isinstance(step, Enough):
                    return True
                if isinstance(step, NoWorkerCameBack):
                    return False
                await asyncio.sleep(1)

    async def _verify(self, spec: RolloutSpec, result: RolloutResult) -> None:
        future = self.client.submit(
            verify_patch, spec.agent, result.patch, f"{spec.instance_id}-r{spec.rollout}-verify",
            pure=False, **self.placement, key=f"verify-{spec.instance_id}-r{spec.rollout}-{uuid.uuid4().hex[:6]}",
        )
        # The grader bounds itself by eval_timeout once it runs; this bound also covers a future that never runs
        # or never reports (a lost worker, a stuck thread), so one rollout can never hold the run forever.
        deployment = spec.agent.env.deployment
        limit = spec.agent.reward.eval_timeout + deployment.startup_timeout * deployment.start_retries + VERIFY_MARGIN_S
        try:
            verification: Verification = await asyncio.wait_for(future, limit)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await self.client.cancel([future])
            verification = no_result(limit)
        except Exception as exc:
            verification = Verification(status=VerificationStatus.ERROR, error=redact(f"{type(exc).__name__}: {exc}"))
        with contextlib.suppress(OSError):  # the whole test log beside the results; the row keeps its tail
            verification.keep_log(self.store.output_dir, f"{spec.instance_id}-r{spec.rollout}")
        result.record(verification)  # and classified: a grader that could not run is infra, a wrong answer the model's
