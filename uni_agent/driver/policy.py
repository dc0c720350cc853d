"""The dispatch policy: which agent worker runs a rollout, what a failed actor call leads to, where a replacement goes
and when to stop waiting for one.

A plain object with no I/O, kept apart from the network the way distributed keeps its worker state machine: the
dispatcher (uni_agent.driver.dispatch) tells it what happened (an actor started, a rollout came back, an actor call
failed while the scheduler knew these workers, ...) and carries out what it decides. The clock comes in as an
argument, so tests drive every path without a cluster and without waiting.

The rules:
* a rollout goes to the actor with the fewest rollouts in flight (the first started, on a tie);
* a failed call whose actor's worker the scheduler still knows is retried (the actor may be fine: the connection, or
  the rollout inside it, failed); one whose worker is gone replaces the actor first;
* a rollout runs at most `attempts` times, then it is recorded as an infra failure with the last error; a call that
  failed because the actor could not be reached (its worker died, or is dying and the scheduler does not know yet)
  is the infrastructure's failure, not the rollout's: it is not counted there (a rollout interrupted by a lost worker
  runs again, however many workers are lost around it), only against the much larger `losses_allowed`, the bound on
  a rollout that takes down every worker it runs on;
* actors are replaced up to `actors_wanted`, one at a time, each on the live sandbox worker holding the fewest; with
  no actor left, the dispatcher waits up to `worker_wait_timeout` for a worker to come back, then gives up the run.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass

ACTOR_RETRIES = 2  # a rollout that failed inside its actor runs again, on the same or another actor
LOSSES_ALLOWED = 10  # a rollout whose actor was unreachable this many times is taken for the cause: it gives up
ACTOR_START_TIMEOUT = 60.0  # an actor pinned to a worker that died before the scheduler noticed never starts
MIN_START_TIMEOUT = 5.0  # a replacement's start is given at least this long, even at the end of the wait


# -- what the policy decides for a rollout -------------------------------------------------------------------------

@dataclass(frozen=True)
class Send:
    """Run the rollout on this actor."""

    actor: str


@dataclass(frozen=True)
class NeedActor:
    """No actor is left: start one (waiting for a worker if need be) before the rollout can run."""


@dataclass(frozen=True)
class GiveUp:
    """The rollout's attempts are spent: record it as an infra failure with this error."""

    error: str


@dataclass(frozen=True)
class Retry:
    """The call failed but the scheduler still knows its actor's worker: run the rollout again (next_step says
    where)."""


@dataclass(frozen=True)
class Replace:
    """The actor's worker is gone: replace the actor, then run the rollout again."""

    actor: str


# -- what the policy decides while replacing actors ----------------------------------------------------------------

@dataclass(frozen=True)
class StartActor:
    """Start an actor on this worker, giving up on it after `timeout` seconds."""

    worker: str
    timeout: float


@dataclass(frozen=True)
class Enough:
    """Actors are left to run rollouts on: stop replacing."""


@dataclass(frozen=True)
class WaitForWorker:
    """No actor is left and none could start: look for a worker again in a moment."""


@dataclass(frozen=True)
class NoWorkerCameBack:
    """No actor is left and the wait is over: the rollouts not yet run cannot run."""


class DispatchPolicy:
    def __init__(self, actors_wanted: int, worker_wait_timeout: float, attempts: int = ACTOR_RETRIES + 1,
                 losses_allowed: int = LOSSES_ALLOWED):
        self.actors_wanted = max(1, actors_wanted)
        self.worker_wait_timeout = worker_wait_timeout
        self.attempts, self.losses_allowed = attempts, losses_allowed
        self.placed: dict[str, str] = {}  # actor -> the worker it runs on, in the order they started
        self.in_flight: dict[str, int] = {}  # actor -> rollouts sent to it and not back
        self.errors: dict[Hashable, list[str]] = {}  # rollout -> the errors of its failed attempts so far
        self.losses: dict[Hashable, list[str]] = {}  # rollout -> the errors of its calls to an unreachable actor
        self.wait_until = 0.0  # the end of the current wait for a worker (replacement_begins)

    # -- actors ----------------------------------------------------------------------------------------------------

    def initial_workers(self, workers: list[str]) -> list[str]:
        """Where the run's first actors go: `actors_wanted` of them, round robin over the sandbox workers."""
        return [workers[i % len(workers)] for i in range(self.actors_wanted)]

    def actor_started(self, actor: str, worker: str) -> None:
        self.placed[actor] = worker
        self.in_flight.setdefault(actor, 0)

    def drop(self, lost: str | None, live: Iterable[str]) -> list[str]:
        """Forget `lost` and every actor whose worker is not in `live`; returns the actors dropped."""
        live = set(live)
        dropped = [a for a in self.placed if a == lost or self.placed[a] not in live]
        for actor in dropped:
            del self.placed[actor]
        return dropped

    def enough_actors(self) -> bool:
        return len(self.placed) >= self.actors_wanted

    # -- rollouts --------------------------------------------------------------------------------------------------

    def next_step(self, rollout: Hashable) -> Send | NeedActor | GiveUp:
        """What to do with a rollout about to run (again). Send counts it in flight on that actor."""
        errors, losses = self.errors.get(rollout, []), self.losses.get(rollout, [])
        if len(errors) >= self.attempts or len(losses) >= self.losses_allowed:
            self._forget(rollout)
            return GiveUp(errors[-1] if len(errors) >= self.attempts else
                          f"its agent worker could not be reached {len(losses)} times; last: {losses[-1]}")
        if not self.placed:
            return NeedActor()
        actor = min(self.placed, key=lambda a: self.in_flight.get(a, 0))
        self.in_flight[actor] = self.in_flight.get(actor, 0) + 1
        return Send(actor)

    def rollout_done(self, rollout: Hashable, actor: str) -> None:
        """The actor returned the rollout's result."""
        self._back(actor)
        self._forget(rollout)

    def call_failed(self, rollout: Hashable, actor: str, error: str, live: Iterable[str],
                    unreachable: bool = False) -> Retry | Replace:
        """The actor call failed with `error` while the scheduler knew the workers `live`. `unreachable`: the actor
        could not be reached (rather than the rollout failing inside it), which does not count as an attempt."""
        self._back(actor)
        (self.losses if unreachable else self.errors).setdefault(rollout, []).append(error)
        return Retry() if self.placed.get(actor) in set(live) else Replace(actor)

    def rollout_abandoned(self, rollout: Hashable) -> None:
        """The rollout will not run (no worker came back): forget it."""
        self._forget(rollout)

    def _forget(self, rollout: Hashable) -> None:
        self.errors.pop(rollout, None)
        self.losses.pop(rollout, None)

    def _back(self, actor: str) -> None:
        self.in_flight[actor] = self.in_flight.get(actor, 0) - 1

    # -- replacing actors ------------------------------------------------------------------------------------------

    def replacement_begins(self, now: float) -> None:
        """Start the clock of the wait for a worker (worker_wait_timeout)."""
        self.wait_until = now + self.worker_wait_timeout

    def replacement_step(self, sandbox_workers: list[str], now: float) -> StartActor | Enough | WaitForWorker | \
            NoWorkerCameBack:
        """With live sandbox workers, start an actor on the one holding the fewest; else as start_failed."""
        if not sandbox_workers:
            return self.start_failed(now)
        held = list(self.placed.values())
        worker = min(sandbox_workers, key=held.count)
        return StartActor(worker, min(ACTOR_START_TIMEOUT, max(MIN_START_TIMEOUT, self.wait_until - now)))

    def start_failed(self, now: float) -> Enough | WaitForWorker | NoWorkerCameBack:
        """No actor could start this time: carry on with those left, wait for a worker, or give up at the end."""
        if self.placed:
            return Enough()
        return NoWorkerCameBack() if now > self.wait_until else WaitForWorker()
