"""Live run state: a pure fold of rollout events (see uni_agent.events) into what the page and the metrics show.

No I/O and no clock: `DashboardState.apply(msg)` folds one event; `snapshot(run_id, now)` and `rollout_detail(...)`
read. The records it keeps are in records.py. The scheduler plugin owns one and feeds it every event logged under
the uni-agent topic. The fold and its reads stay one class in one file (~300 lines): the reads use the fold's own
bookkeeping (active rollouts, recent windows, sorted starts) and change with it.

Events reach the scheduler by two paths (the driver's client and the worker running the rollout), so they can
arrive out of order: a rollout's last `running` event may land after the driver's `verifying`. The fold keeps each
rollout's state moving forward (queued → starting_sandbox → running → verifying → done | failed), accepts a step
backwards only when it is newer by its own timestamp (a retried rollout starts its sandbox again; a restarted driver
queues it again), drops exact duplicates, and treats done/failed as final. A `queued` older than everything known of
its rollout (the driver sends them while the rollouts start) adds its time and max_turns, and moves nothing.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from typing import Any

from ..events import PAGE_TRAJECTORIES, STATES, unbatch
from .records import WINDOW_S, Key, Rollout, RunState, Totals, count_since, push_recent

TERMINAL = frozenset({"done", "failed"})
IN_SANDBOX = frozenset({"starting_sandbox", "running"})  # load on the rollout's agent worker
RANK = {"queued": 0, "starting_sandbox": 1, "running": 2, "verifying": 3, "done": 4, "failed": 4}
FINAL_FIELDS = ("reward", "resolved", "exit_reason", "num_turns", "prompt_tokens", "completion_tokens",
                "sandbox_start_s", "llm_s", "tools_s", "verify_s", "total_s", "worker", "error", "error_kind")


class DashboardState:
    """The fold (`apply`) and its reads (`snapshot`, `rollout_detail`, `gauges`, `run_list`); the records it keeps
    are in records.py."""

    def __init__(self, max_runs: int = 50, max_trajectories: int = PAGE_TRAJECTORIES):
        self.max_runs, self.max_trajectories = max_runs, max_trajectories
        self.runs: dict[str, RunState] = {}
        self.latest_run: str | None = None
        self.totals = Totals()
        self.version = 0  # bumped by every accepted event
        self._trajectories: deque[tuple[str, Key]] = deque()

    # -- folding -------------------------------------------------------------------------------------------------

    def apply(self, msg: Any) -> bool:
        """Fold one event, or each event of a batch (uni_agent.events.batch_event); False when it was ignored (not a
        rollout event, malformed, stale or a duplicate; a batch: when all of its events were)."""
        events = unbatch(msg)
        if len(events) != 1 or events[0] is not msg:
            return sum(self._apply_one(m) for m in events) > 0
        return self._apply_one(msg)

    def _apply_one(self, msg: Any) -> bool:
        self.totals.events += 1
        if isinstance(msg, dict) and msg.get("kind") == "notice" and isinstance(msg.get("run_id"), str):
            run = self.runs.get(msg["run_id"]) or self._new_run(msg["run_id"])
            run.notices.append({k: msg.get(k) for k in ("level", "message", "t")})
            self.version += 1
            return True
        parsed = _parse(msg)
        if parsed is None:
            self.totals.ignored += 1
            return False
        run_id, key, state, t = parsed
        run = self.runs.get(run_id)
        if run is None:
            run = self._new_run(run_id)
        r = run.rollouts.get(key)
        if r is None:
            r = run.rollouts[key] = Rollout(run_id, key[0], key[1], state="", t=t, first_t=t)
        elif not _accepts(r, state, t, msg):
            if state == "queued" and t < r.first_t:  # the driver's queued, overtaken by the worker's first events
                self._queued_late(run, r, t, msg)
                return True
            self.totals.ignored += 1
            return False
        self._transition(run, r, state, t, msg)
        run.first_t = t if run.first_t is None else min(run.first_t, t)
        run.last_t = t if run.last_t is None else max(run.last_t, t)
        self.version += 1
        return True

    def _new_run(self, run_id: str) -> RunState:
        run = self.runs[run_id] = RunState(run_id)
        self.latest_run = run_id
        while len(self.runs) > self.max_runs:
            idle = [r for r in self.runs.values() if r.run_id != run_id and not r.unfinished]
            oldest = idle[0] if idle else next(iter(self.runs.values()))
            del self.runs[oldest.run_id]
        return run

    def _transition(self, run: RunState, r: Rollout, state: str, t: float, msg: dict[str, Any]) -> None:
        old = r.state
        worker = str(msg.get("worker") or r.worker or "")
        if old:
            run.counts[old] -= 1
        run.counts[state] += 1
        if old in IN_SANDBOX and r.worker:
            run.worker(r.worker).in_sandbox -= 1
        if state in IN_SANDBOX and worker:
            run.worker(worker).in_sandbox += 1
        if state in TERMINAL or state == "queued":
            run.active.pop(r.key, None)
        else:
            run.active[r.key] = r
        r.state, r.t, r.worker = state, t, worker
        turn = _int(msg.get("turn")) if state == "running" else None
        r.history.append((state, t, turn))
        if msg.get("max_turns") is not None:
            r.max_turns = _int(msg.get("max_turns"))

        if state == "queued":
            r.turn, r.starting_t = 0, None
        elif state == "starting_sandbox":
            r.starting_t, r.turn = t, 0
        elif state == "running":
            if r.turn == 0 and r.starting_t is not None and r.key not in run.sandbox_start:
                run.record_sandbox_start(r.key, max(0.0, t - r.starting_t))
            r.turn = turn or r.turn + 1
            run.turns += 1
            self.totals.turns += 1
            push_recent(run.turn_times, t)
            if worker:
                run.worker(worker).turns += 1
        elif state in TERMINAL:
            self._finish(run, r, state, t, msg)

    def _queued_late(self, run: RunState, r: Rollout, t: float, msg: dict[str, Any]) -> None:
        """Not a step back: what the rollout's queued event adds (its time first in the history, its max_turns)."""
        r.first_t = t
        r.history.insert(0, ("queued", t, None))
        if r.max_turns is None and msg.get("max_turns") is not None:
            r.max_turns = _int(msg.get("max_turns"))
        run.first_t = t if run.first_t is None else min(run.first_t, t)
        self.version += 1

    def _finish(self, run: RunState, r: Rollout, state: str, t: float, msg: dict[str, Any]) -> None:
        final = {k: msg.get(k) for k in FINAL_FIELDS}
        reward = _float(final.get("reward")) or 0.0
        final["reward"] = reward
        r.final = final
        if final.get("num_turns") is not None:
            r.turn = _int(final["num_turns"]) or r.turn
        run.finished += 1
        run.reward_sum += reward
        run.resolved += bool(final.get("resolved"))
        run.last_finish_t = t if run.last_finish_t is None else max(run.last_finish_t, t)
        push_recent(run.finish_times, t)
        exit_reason = str(final.get("exit_reason") or state)
        run.exit_reasons[exit_reason] += 1
        self.totals.finished[exit_reason] += 1
        self.totals.reward_sum += reward
        self.totals.resolved += bool(final.get("resolved"))
        if final.get("error") or state == "failed":
            kind = str(final.get("error_kind") or "error")
            run.error_kinds[kind] += 1
            self.totals.errors[kind] += 1
            run.failures.append(r.key)
        run.recent.append(r.key)
        if r.worker:
            load = run.worker(r.worker)
            load.finished += 1
            load.failed += state == "failed"
            load.reward_sum += reward
        measured = _float(final.get("sandbox_start_s"))
        if measured and measured > 0:
            run.record_sandbox_start(r.key, measured)
        if r.key in run.sandbox_start:
            self.totals.observe_sandbox_start(run.sandbox_start[r.key])
        messages, verification = msg.get("messages"), msg.get("verification")
        if msg.get("trajectory") == "evicted":  # trimmed by the driver (events.trim_trajectories): as if evicted here
            r.trajectory_evicted = True
        elif messages is not None or verification is not None:
            r.messages = messages if isinstance(messages, str) else None
            r.verification = verification if isinstance(verification, str) else None
            self._trajectories.append((run.run_id, r.key))
            while len(self._trajectories) > self.max_trajectories:
                self._evict_trajectory(*self._trajectories.popleft())

    def _evict_trajectory(self, run_id: str, key: Key) -> None:
        old = self.runs.get(run_id)
        r = old.rollouts.get(key) if old else None
        if r is not None:
            r.messages = r.verification = None
            r.trajectory_evicted = True

    # -- reading -------------------------------------------------------------------------------------------------

    def run_list(self) -> list[dict[str, Any]]:
        return [{"run_id": r.run_id, "total": len(r.rollouts), "done": r.counts["done"], "failed": r.counts["failed"],
                 "first_t": r.first_t, "last_t": r.last_t} for r in reversed(self.runs.values())]

    def snapshot(self, run_id: str | None = None, now: float | None = None, limit: int = 200) -> dict[str, Any]:
        """The page's view of one run (default: the newest); `now` is the reader's clock for rates and ages."""
        run = self.runs.get(run_id or self.latest_run or "")
        base = {"version": self.version, "runs": self.run_list(), "now": now}
        if run is None:
            return {**base, "run_id": run_id, "found": False, "total": 0, "counts": dict.fromkeys(STATES, 0)}
        now = base["now"] = now if now is not None else (run.last_t or 0.0)
        until = now if run.unfinished or run.last_t is None else run.last_t  # a finished run's clock stops
        elapsed = max(0.0, until - run.first_t) if run.first_t is not None else 0.0
        window = max(1.0, min(WINDOW_S, elapsed)) if elapsed else None
        recent_finishes = count_since(run.finish_times, now - WINDOW_S)
        recent_turns = count_since(run.turn_times, now - WINDOW_S)
        end = run.last_finish_t if not run.unfinished and run.last_finish_t is not None else now
        finished_span = end - run.first_t if run.first_t is not None else 0.0
        per_min_recent = recent_finishes / window * 60 if window else 0.0
        remaining = run.unfinished
        eta = remaining / per_min_recent * 60 if remaining and per_min_recent else (0.0 if not remaining else None)
        starts = run.sorted_sandbox_starts()
        rows = lambda keys: [run.rollouts[k].row() for k in reversed(keys) if k in run.rollouts][:limit]  # noqa: E731
        # The first `limit` of the active rollouts without sorting them all (20,000 in flight: n log limit).
        active = heapq.nsmallest(limit, run.active.values(), key=lambda r: (RANK[r.state], r.first_t))
        return {
            **base,
            "run_id": run.run_id,
            "found": True,
            "total": len(run.rollouts),
            "counts": {s: run.counts[s] for s in STATES},
            "first_t": run.first_t,
            "last_t": run.last_t,
            "elapsed_s": elapsed,
            "finished": run.finished,
            "avg_reward": run.reward_sum / run.finished if run.finished else None,
            "resolved": run.resolved,
            "turns": run.turns,
            "rollouts_per_min": {"recent": per_min_recent,
                                 "overall": run.finished / finished_span * 60 if finished_span > 0 else 0.0},
            "turns_per_s": {"recent": recent_turns / window if window else 0.0,
                            "overall": run.turns / elapsed if elapsed else 0.0},
            "window_s": WINDOW_S,
            "eta_s": eta,
            "sandbox_start_s": {"n": len(starts), "p50": percentile(starts, 50), "p95": percentile(starts, 95),
                                "max": starts[-1] if starts else None},
            "exit_reasons": dict(run.exit_reasons.most_common()),
            "errors_by_kind": dict(run.error_kinds.most_common()),
            "workers": [{"worker": w, "in_sandbox": load.in_sandbox, "finished": load.finished, "failed": load.failed,
                         "turns": load.turns, "avg_reward": load.reward_sum / load.finished if load.finished else None}
                        for w, load in sorted(run.workers.items())],
            "active_total": len(run.active),
            "active": [r.row() for r in active],
            "recent": rows(run.recent),
            "failures": rows(run.failures),
            "notices": list(reversed(run.notices)),
        }

    def rollout_detail(self, run_id: str, instance_id: str, rollout: int) -> dict[str, Any] | None:
        run = self.runs.get(run_id)
        r = run.rollouts.get((instance_id, rollout)) if run else None
        if r is None:
            return None
        if r.messages is not None or r.verification is not None:
            trajectory = "held"
        else:
            trajectory = "evicted" if r.trajectory_evicted else ("pending" if r.state not in TERMINAL else "none")
        return {"run_id": run_id, **r.row(), "history": [list(h) for h in r.history], "final": r.final,
                "sandbox_start_s": run.sandbox_start.get(r.key), "trajectory": trajectory,
                "messages": r.messages, "verification": r.verification}

    def gauges(self) -> dict[str, Any]:
        """Current values over every run held (for Prometheus gauges)."""
        counts: Counter[str] = Counter()
        in_sandbox: Counter[str] = Counter()
        for run in self.runs.values():
            counts.update(run.counts)
            for address, load in run.workers.items():
                in_sandbox[address] += load.in_sandbox
        latest = self.runs.get(self.latest_run or "")
        return {"counts": {s: counts[s] for s in STATES}, "in_sandbox": dict(in_sandbox),
                "latest_avg_reward": latest.reward_sum / latest.finished if latest and latest.finished else None,
                "runs": len(self.runs)}


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default) of an already sorted list."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _accepts(r: Rollout, state: str, t: float, msg: dict[str, Any]) -> bool:
    if r.state in TERMINAL:
        return False
    if RANK[state] > RANK[r.state]:
        return True
    if RANK[state] == RANK[r.state]:
        if state == "running":
            turn = _int(msg.get("turn"))
            return turn > r.turn if turn else t > r.t
        return t > r.t
    return t > r.t  # a step back (retry on another actor, a restarted driver) only when it is newer


def _parse(msg: Any) -> tuple[str, Key, str, float] | None:
    if not isinstance(msg, dict) or msg.get("kind") != "rollout" or msg.get("state") not in RANK:
        return None
    run_id, instance_id = msg.get("run_id"), msg.get("instance_id")
    if not isinstance(run_id, str) or not isinstance(instance_id, str):
        return None
    try:
        rollout, t = int(msg["rollout"]), float(msg["t"])
    except (KeyError, TypeError, ValueError):
        return None
    if not math.isfinite(t):
        return None
    return run_id, (instance_id, rollout), msg["state"], t


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _float(value: Any) -> float | None:
    try:
        result = float(value)
    except (TypeError, ValueError):
        return None
    return result if math.isfinite(result) else None
