"""What the dashboard's fold keeps (state.py folds events into these): one record per rollout, the load per worker,
everything known about one run, and the counters over everything folded; and the sliding window of the "recent"
rates (event times within WINDOW_S of the newest)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

WINDOW_S = 60.0  # the window of the "recent" rates
SANDBOX_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

Key = tuple[str, int]  # (instance_id, rollout)


@dataclass
class Rollout:
    run_id: str
    instance_id: str
    rollout: int
    state: str
    t: float  # timestamp of the last accepted event
    first_t: float
    turn: int = 0
    max_turns: int | None = None
    worker: str = ""
    starting_t: float | None = None
    history: list[tuple[str, float, int | None]] = field(default_factory=list)
    final: dict[str, Any] | None = None
    messages: str | None = None  # JSON text, as the event carried it (clipped by the driver)
    verification: str | None = None
    trajectory_evicted: bool = False

    @property
    def key(self) -> Key:
        return (self.instance_id, self.rollout)

    def row(self) -> dict[str, Any]:
        """The compact form for tables."""
        final = self.final or {}
        return {"instance_id": self.instance_id, "rollout": self.rollout, "state": self.state, "turn": self.turn,
                "max_turns": self.max_turns, "worker": self.worker, "t": self.t, "first_t": self.first_t,
                "started_t": self.starting_t,
                "reward": final.get("reward"), "exit_reason": final.get("exit_reason"),
                "error_kind": final.get("error_kind"), "num_turns": final.get("num_turns"),
                "total_s": final.get("total_s")}


@dataclass
class WorkerLoad:
    in_sandbox: int = 0  # rollouts starting a sandbox or running turns on this worker now
    finished: int = 0
    failed: int = 0
    turns: int = 0
    reward_sum: float = 0.0


class RunState:
    """Everything known about one run_id."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.rollouts: dict[Key, Rollout] = {}
        self.counts: Counter[str] = Counter()
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.last_finish_t: float | None = None
        self.finish_times: deque[float] = deque()  # within WINDOW_S of the newest event
        self.turn_times: deque[float] = deque()
        self.finished = self.resolved = self.turns = 0
        self.reward_sum = 0.0
        self.exit_reasons: Counter[str] = Counter()
        self.error_kinds: Counter[str] = Counter()
        self.sandbox_start: dict[Key, float] = {}  # time to first turn, replaced by the measured start when done
        self._sorted_starts: tuple[int, list[float]] = (-1, [])  # (changes, sorted values): sorted once per change
        self._start_changes = 0
        self.workers: dict[str, WorkerLoad] = {}
        self.active: dict[Key, Rollout] = {}  # starting_sandbox, running, verifying
        self.recent: deque[Key] = deque(maxlen=200)  # finished, newest last
        self.failures: deque[Key] = deque(maxlen=200)  # finished with an error, newest last
        self.notices: deque[dict[str, Any]] = deque(maxlen=20)  # run-level messages (uni_agent.events.notice_event)

    def worker(self, address: str) -> WorkerLoad:
        load = self.workers.get(address)
        if load is None:
            load = self.workers[address] = WorkerLoad()
        return load

    @property
    def unfinished(self) -> int:
        return len(self.rollouts) - self.finished

    def record_sandbox_start(self, key: Key, seconds: float) -> None:
        self.sandbox_start[key] = seconds
        self._start_changes += 1

    def sorted_sandbox_starts(self) -> list[float]:
        if self._sorted_starts[0] != self._start_changes:
            self._sorted_starts = (self._start_changes, sorted(self.sandbox_start.values()))
        return self._sorted_starts[1]


@dataclass
class Totals:
    """Cumulative over everything this state ever folded (Prometheus counters); never decreases."""

    events: int = 0
    ignored: int = 0
    turns: int = 0
    reward_sum: float = 0.0
    resolved: int = 0
    finished: Counter[str] = field(default_factory=Counter)  # by exit_reason
    errors: Counter[str] = field(default_factory=Counter)  # by error_kind
    sandbox_buckets: list[int] = field(default_factory=lambda: [0] * len(SANDBOX_BUCKETS))
    sandbox_count: int = 0
    sandbox_sum: float = 0.0

    def observe_sandbox_start(self, seconds: float) -> None:
        self.sandbox_count += 1
        self.sandbox_sum += seconds
        for i, bound in enumerate(SANDBOX_BUCKETS):
            if seconds <= bound:
                self.sandbox_buckets[i] += 1


def push_recent(times: deque[float], t: float) -> None:
    """Add an event time and drop those older than WINDOW_S before it."""
    times.append(t)
    while times and times[0] < t - WINDOW_S:
        times.popleft()


def count_since(times: deque[float], since: float) -> int:
    """How many of the times (oldest first) are at or after `since`."""
    count = 0
    for t in reversed(times):
        if t < since:
            break
        count += 1
    return count
