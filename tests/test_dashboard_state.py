"""The dashboard's fold of rollout events into live state (pure, no clock), and the scheduler plugin that serves it
from a real in-process Dask scheduler (HTTP routes, Prometheus metrics, idempotent registration, catch-up)."""

import asyncio
import json
import random
import urllib.error
import urllib.request

import numpy as np
import pytest

from uni_agent.dashboard import DashboardState, UniAgentDashboard, page_token, page_url
from uni_agent.dashboard.state import percentile
from uni_agent.events import STATES, TOPIC, batch_event, trim_trajectories


def ev(state, instance="a", k=0, t=0.0, run="run-1", **fields):
    return {"kind": "rollout", "run_id": run, "instance_id": instance, "rollout": k, "state": state, "t": t, **fields}


def lifecycle(instance="a", k=0, t0=0.0, worker="w1", turns=3, reward=1.0, run="run-1", failed=False, start=0.5,
              **final):
    """The events of one rollout as the driver and its worker log them."""
    events = [ev("queued", instance, k, t0, run, max_turns=5),
              ev("starting_sandbox", instance, k, t0 + 1, run, worker=worker)]
    for turn in range(1, turns + 1):
        events.append(ev("running", instance, k, t0 + 1 + start + turn - 1, run, worker=worker, turn=turn,
                         max_turns=5))
    end = t0 + 1 + start + turns
    events.append(ev("verifying", instance, k, end, run, worker=worker))
    fields = dict(reward=reward, resolved=reward >= 1, exit_reason="error" if failed else "submitted",
                  num_turns=turns, sandbox_start_s=start, llm_s=1.0, tools_s=0.5, verify_s=0.2, total_s=end - t0,
                  worker=worker, error=None, error_kind=None, messages='[{"role": "user", "content": "fix it"}]',
                  verification='{"status": "resolved"}')
    fields.update(final)
    events.append(ev("failed" if failed else "done", instance, k, end + 1, run, **fields))
    return events


def fold(events, **kwargs):
    state = DashboardState(**kwargs)
    for e in events:
        state.apply(e)
    return state


def test_one_rollout_moves_through_every_state():
    state = DashboardState()
    events = lifecycle(turns=2)
    seen = []
    for e in events:
        assert state.apply(e)
        snap = state.snapshot(now=e["t"])
        seen.append({s: n for s, n in snap["counts"].items() if n})
        if e["state"] == "running":
            (row,) = snap["active"]
            assert (row["turn"], row["max_turns"]) == (e["turn"], 5)
    assert seen == [{"queued": 1}, {"starting_sandbox": 1}, {"running": 1}, {"running": 1}, {"verifying": 1},
                    {"done": 1}]
    snap = state.snapshot(now=100)
    assert snap["total"] == 1 and snap["finished"] == 1 and snap["avg_reward"] == 1.0 and snap["resolved"] == 1
    assert snap["active"] == [] and snap["recent"][0]["instance_id"] == "a" and snap["recent"][0]["reward"] == 1.0
    assert snap["exit_reasons"] == {"submitted": 1} and snap["errors_by_kind"] == {}
    assert snap["eta_s"] == 0.0
    detail = state.rollout_detail("run-1", "a", 0)
    assert [h[0] for h in detail["history"]] == [
        "queued", "starting_sandbox", "running", "running", "verifying", "done"]
    assert detail["trajectory"] == "held" and json.loads(detail["messages"])[0]["content"] == "fix it"
    assert state.rollout_detail("run-1", "a", 1) is None and state.rollout_detail("other", "a", 0) is None


def test_sandbox_start_is_time_to_first_turn_until_the_measured_value_arrives():
    events = lifecycle(start=2.0, sandbox_start_s=1.25)
    state = fold(events[:3])  # queued, starting_sandbox, first turn
    assert state.snapshot()["sandbox_start_s"]["p50"] == pytest.approx(2.0)
    state = fold(events)
    assert state.snapshot()["sandbox_start_s"] == {"n": 1, "p50": 1.25, "p95": 1.25, "max": 1.25}


def test_late_and_duplicate_events_do_not_move_a_rollout_backwards():
    events = lifecycle(turns=3)
    state = DashboardState()
    for e in events[:4]:  # up to running turn 2
        state.apply(e)
    verifying, last_turn, done = events[-2], events[4], events[-1]
    assert state.apply(verifying)
    assert not state.apply(last_turn)  # logged by the worker before verifying, arrived after it
    assert not state.apply(verifying)  # an exact duplicate
    assert state.apply(done)
    for e in events:  # done is final: nothing moves it
        assert not state.apply(e)
    snap = state.snapshot()
    assert snap["counts"]["done"] == 1 and sum(snap["counts"].values()) == 1
    assert snap["turns"] == 2 and snap["finished"] == 1
    assert state.totals.ignored == len(events) + 2


def test_a_retried_rollout_starts_again_and_a_restarted_driver_queues_again():
    state = fold(lifecycle(turns=3)[:5])  # running turn 3
    assert state.apply(ev("starting_sandbox", t=10, worker="w2"))  # the actor died; another one runs it
    snap = state.snapshot()
    assert snap["counts"]["starting_sandbox"] == 1 and snap["active"][0]["turn"] == 0
    assert {w["worker"]: w["in_sandbox"] for w in snap["workers"]} == {"w1": 0, "w2": 1}
    assert state.apply(ev("queued", t=11, max_turns=5))  # the driver restarted
    assert state.snapshot()["counts"]["queued"] == 1
    assert state.apply(ev("running", t=12, worker="w3", turn=1))
    assert not state.apply(ev("starting_sandbox", t=9, worker="w2"))  # a step back, older than what we know
    assert state.snapshot()["active"][0]["worker"] == "w3"


def test_malformed_and_foreign_events_are_ignored():
    state = DashboardState()
    bad = [None, "text", {"kind": "other"}, ev("exploded"), {**ev("queued"), "rollout": "x"},
           {**ev("queued"), "t": float("nan")}, {k: v for k, v in ev("queued").items() if k != "run_id"},
           {k: v for k, v in ev("queued").items() if k != "t"}]
    for msg in bad:
        assert not state.apply(msg)
    assert state.totals.ignored == len(bad) and state.runs == {}
    assert state.snapshot()["found"] is False


def test_a_rollout_first_seen_mid_flight_is_counted():
    state = DashboardState()
    assert state.apply(ev("running", t=5, worker="w1", turn=3, max_turns=8))
    snap = state.snapshot()
    assert snap["total"] == 1 and snap["counts"]["running"] == 1 and snap["active"][0]["turn"] == 3


def test_rates_windows_and_eta():
    events = []
    for i in range(10):  # ten rollouts finishing one every 10 s, 3 turns each
        events += lifecycle(f"t{i}", t0=i * 10.0, turns=3)
    for e in events:  # the driver queues every rollout up front
        e["t"] = 0.0 if e["state"] == "queued" else e["t"]
    events.sort(key=lambda e: e["t"])
    state = fold(events[: len(events) // 2])
    last_t = events[len(events) // 2 - 1]["t"]
    snap = state.snapshot(now=last_t)
    finished = snap["finished"]
    assert 0 < finished < 10
    window = min(60, last_t - events[0]["t"])  # the window is the run's age until the run is a minute old
    assert snap["rollouts_per_min"]["recent"] == pytest.approx(
        sum(1 for e in events[: len(events) // 2] if e["state"] == "done" and e["t"] >= last_t - 60) / window * 60)
    assert snap["eta_s"] == pytest.approx((10 - finished) / snap["rollouts_per_min"]["recent"] * 60)
    state = fold(events)
    end = events[-1]["t"]
    snap = state.snapshot(now=end + 1000)  # long after the run: overall rate is over the run's own span
    assert snap["rollouts_per_min"]["overall"] == pytest.approx(10 / end * 60)
    assert snap["rollouts_per_min"]["recent"] == 0 and snap["turns_per_s"]["recent"] == 0
    assert snap["turns"] == 30 and snap["turns_per_s"]["overall"] == pytest.approx(30 / end)
    assert snap["elapsed_s"] == end


def test_percentiles_match_numpy():
    rng = random.Random(3)
    for size in (1, 2, 5, 101):
        values = sorted(rng.uniform(0, 10) for _ in range(size))
        for q in (50, 95):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert percentile([], 50) is None


def test_avg_reward_errors_exit_reasons_and_workers():
    events = (lifecycle("a", 0, reward=1.0, worker="w1") + lifecycle("a", 1, reward=0.0, worker="w2")
              + lifecycle("b", 0, reward=0.0, worker="w1", failed=True, error="LLMError: HTTP 403",
                          error_kind="LLMError")
              + lifecycle("b", 1, reward=0.0, worker="w2", error="verification timeout: 300 s",
                          error_kind="verification timeout", exit_reason="max_turns"))
    state = fold(events)
    state.apply(ev("starting_sandbox", "c", 0, 50, worker="w1"))
    snap = state.snapshot(now=60)
    assert snap["avg_reward"] == pytest.approx(0.25) and snap["resolved"] == 1
    assert snap["counts"]["done"] == 3 and snap["counts"]["failed"] == 1 and snap["counts"]["starting_sandbox"] == 1
    assert snap["exit_reasons"] == {"submitted": 2, "error": 1, "max_turns": 1}
    assert snap["errors_by_kind"] == {"LLMError": 1, "verification timeout": 1}
    assert [(r["instance_id"], r["rollout"]) for r in snap["failures"]] == [("b", 1), ("b", 0)]
    workers = {w["worker"]: w for w in snap["workers"]}
    assert workers["w1"]["in_sandbox"] == 1 and workers["w1"]["finished"] == 2 and workers["w1"]["failed"] == 1
    assert workers["w2"]["in_sandbox"] == 0 and workers["w2"]["avg_reward"] == 0.0
    assert state.totals.errors == {"LLMError": 1, "verification timeout": 1}


@pytest.mark.parametrize("seed", range(20))
def test_any_arrival_order_keeps_the_counts_consistent(seed):
    """Shuffled events (late, early, duplicated): every rollout is counted once, loads never go negative, and a
    rollout whose done/failed arrived is finished."""
    rng = random.Random(seed)
    events = []
    for i in range(12):
        events += lifecycle(f"i{i % 4}", i // 4, t0=rng.uniform(0, 5), worker=f"w{i % 3}", turns=rng.randint(1, 4),
                            reward=float(rng.random() < 0.5), failed=rng.random() < 0.2)
    events += rng.sample(events, 10)
    rng.shuffle(events)
    state = fold(events)
    snap = state.snapshot(now=100)
    assert sum(snap["counts"].values()) == snap["total"] == 12
    assert snap["counts"]["done"] + snap["counts"]["failed"] == snap["finished"] == 12
    assert all(n >= 0 for n in snap["counts"].values())
    assert all(w["in_sandbox"] == 0 for w in snap["workers"]) and snap["active"] == []


def test_runs_are_kept_apart_and_old_finished_runs_are_dropped():
    state = DashboardState(max_runs=2)
    for e in lifecycle(run="r1"):
        state.apply(e)
    state.apply(ev("queued", run="r2", t=1))
    assert state.snapshot()["run_id"] == "r2" and state.snapshot("r1")["counts"]["done"] == 1
    assert [r["run_id"] for r in state.snapshot()["runs"]] == ["r2", "r1"]
    state.apply(ev("queued", run="r3", t=2))
    assert set(state.runs) == {"r2", "r3"}  # r1 was finished: dropped first
    state.apply(ev("queued", run="r4", t=3))
    assert set(state.runs) == {"r3", "r4"}  # none finished: the oldest goes
    assert state.snapshot("r1")["found"] is False
    assert state.totals.finished == {"submitted": 1}  # counters keep what dropped runs did


def test_old_trajectories_are_evicted_beyond_the_limit():
    events = []
    for i in range(5):
        events += lifecycle(f"t{i}", t0=i)
    state = fold(events, max_trajectories=3)
    held = [state.rollout_detail("run-1", f"t{i}", 0)["trajectory"] for i in range(5)]
    assert held == ["evicted", "evicted", "held", "held", "held"]
    assert state.rollout_detail("run-1", "t0", 0)["messages"] is None
    state.apply(ev("running", "x", 0, 1, turn=1, worker="w"))
    assert state.rollout_detail("run-1", "x", 0)["trajectory"] == "pending"


def test_trajectories_the_driver_trims_leave_the_page_as_the_full_events_do():
    """The driver sends only the trajectories of the last PAGE_TRAJECTORIES finished rollouts of a flush; the page
    would have evicted the others on arrival. Each rollout's detail is the same either way (in one batch, one by
    one, and after earlier trajectories were held)."""
    earlier = [e for i in range(4) for e in lifecycle(f"old{i}", t0=i)]
    wave = [e for i in range(12) for e in lifecycle(f"t{i}", t0=10 + i, failed=i % 5 == 0)]
    trimmed = [dict(e) for e in wave]
    assert trim_trajectories(trimmed, keep=5) == 7
    assert [("messages" in e, e.get("trajectory")) for e in trimmed if e["state"] in ("done", "failed")] == \
        [(False, "evicted")] * 7 + [(True, None)] * 5
    keys = [(f"old{i}", 0) for i in range(4)] + [(f"t{i}", 0) for i in range(12)]
    for as_batch in (False, True):
        full, cut = DashboardState(max_trajectories=5), DashboardState(max_trajectories=5)
        for state, events in ((full, wave), (cut, trimmed)):
            for e in earlier:
                state.apply(e)
            if as_batch:
                state.apply(batch_event(events))
            else:
                for e in events:
                    state.apply(e)
        details = [(full.rollout_detail("run-1", *k), cut.rollout_detail("run-1", *k)) for k in keys]
        assert all(a == b for a, b in details), [k for k, (a, b) in zip(keys, details, strict=True) if a != b]
        assert [a["trajectory"] for a, _ in details].count("held") == 5


def test_sandbox_histogram_is_cumulative():
    events = lifecycle("a", sandbox_start_s=0.07) + lifecycle("b", sandbox_start_s=3.0)
    totals = fold(events).totals
    assert totals.sandbox_count == 2 and totals.sandbox_sum == pytest.approx(3.07)
    assert totals.sandbox_buckets[0] == 0 and totals.sandbox_buckets[1] == 1  # <= 0.05, <= 0.1
    assert totals.sandbox_buckets[-1] == 2 and totals.sandbox_buckets == sorted(totals.sandbox_buckets)


def test_page_url_sits_next_to_the_dask_dashboard():
    assert page_url("http://127.0.0.1:8787/status") == "http://127.0.0.1:8787/uni-agent"
    assert page_url("http://h:1/prefix/status") == "http://h:1/prefix/uni-agent"
    assert page_url(None) is None


# -- the plugin in a real scheduler ---------------------------------------------------------------------------------


def _get(url, token=None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}  # the pages need the scheduler's token
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, "", exc.read().decode()


def metric_values(text):
    """Prometheus text → {'name{labels}': value}. The metrics are process-wide (prometheus_client's registry) and
    sum every scheduler of the process, so tests compare values before and after."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def metric_deltas(before, after, names):
    return {n: after.get(n, 0.0) - before.get(n, 0.0) for n in names}


def test_plugin_serves_page_json_detail_and_metrics_from_a_real_scheduler():
    from distributed import Client, Scheduler

    async def scenario():
        async with Scheduler(host="127.0.0.1", dashboard_address="127.0.0.1:0") as s, \
                Client(s.address, asynchronous=True) as c:
            before = await asyncio.to_thread(_get, f"http://127.0.0.1:{s.http_server.port}/metrics")
            events = lifecycle("astropy__astropy-1", 0, run="live") + lifecycle("b", 0, run="live", reward=0.0)
            for e in events[:3]:  # logged before the plugin exists: it catches up from the scheduler's log
                await c.log_event(TOPIC, e)
            await c.register_plugin(UniAgentDashboard())
            await c.register_plugin(UniAgentDashboard())  # a second driver: a no-op
            assert sum(isinstance(p, UniAgentDashboard) for p in s.plugins.values()) == 1
            for e in events[3:]:
                await c.log_event(TOPIC, e)
            await c.log_event("other-topic", ev("queued", "zzz", run="live"))
            base, token = f"http://127.0.0.1:{s.http_server.port}", page_token(s)
            return await asyncio.gather(*(asyncio.to_thread(_get, base + path, token) for path in (
                "/uni-agent", "/uni-agent/api/state.json", "/uni-agent/api/state.json?run=nope",
                "/uni-agent/api/rollout/live/astropy__astropy-1/0.json", "/uni-agent/api/rollout/live/zzz/0.json",
                "/metrics", "/uni-agent/api/state.json?limit=x"))), before

    (page, state, other, detail, missing, metrics, bad), before = asyncio.run(scenario())
    assert page[0] == 200 and page[1].startswith("text/html") and "uni-agent/api/state.json" in page[2]
    assert "<script src" not in page[2] and "http" not in page[2].split("<script>")[1].split("</script>")[0]
    snap = json.loads(state[2])
    assert snap["run_id"] == "live" and snap["total"] == 2 and snap["counts"]["done"] == 2
    assert snap["avg_reward"] == 0.5 and snap["turns"] == 6
    assert json.loads(other[2])["found"] is False
    detail = json.loads(detail[2])
    assert [h[0] for h in detail["history"]][:3] == ["queued", "starting_sandbox", "running"]
    assert json.loads(detail["messages"])[0]["role"] == "user"
    assert missing[0] == 404 and bad[0] == 400
    expected = {'uni_agent_rollouts{state="done"}': 2, 'uni_agent_rollouts_finished_total{exit_reason="submitted"}': 2,
                "uni_agent_turns_total": 6, "uni_agent_reward_total": 1, "uni_agent_sandbox_start_seconds_count": 2,
                'uni_agent_sandbox_start_seconds_bucket{le="0.25"}': 0,
                'uni_agent_sandbox_start_seconds_bucket{le="0.5"}': 2}
    after = metric_values(metrics[2])
    assert metric_deltas(metric_values(before[2]), after, expected) == expected
    assert any(name.startswith("dask_scheduler_workers") for name in after)  # Dask's own metrics are still there


def test_plugin_state_does_not_travel_with_the_plugin():
    import pickle

    plugin = UniAgentDashboard(max_runs=3)
    for e in lifecycle():
        plugin.state.apply(e)
    copy = pickle.loads(pickle.dumps(plugin))
    assert copy.max_runs == 3 and copy.state.runs == {} and set(STATES) == set(copy.state.snapshot()["counts"])


def test_preload_installs_the_page_with_the_scheduler():
    from distributed import Scheduler

    async def scenario():
        async with Scheduler(host="127.0.0.1", dashboard_address="127.0.0.1:0", preload=["uni_agent.dashboard"]) as s:
            assert isinstance(s.plugins.get(UniAgentDashboard.name), UniAgentDashboard)
            return await asyncio.to_thread(_get, f"http://127.0.0.1:{s.http_server.port}/uni-agent/api/state.json",
                                           page_token(s))

    status, _, body = asyncio.run(scenario())
    assert status == 200 and json.loads(body)["found"] is False


def test_a_queued_event_overtaken_by_the_workers_first_event_adds_what_it_knows():
    """The driver sends the run's queued events while its rollouts start: a worker's starting_sandbox may be folded
    first. The late queued moves nothing back; it gives the rollout its queued time and max_turns."""
    queued, starting = lifecycle()[:2]
    state = fold([starting])
    assert state.rollout_detail("run-1", "a", 0)["max_turns"] is None
    assert state.apply(queued)
    assert state.snapshot()["counts"]["starting_sandbox"] == 1 and state.snapshot()["counts"]["queued"] == 0
    detail = state.rollout_detail("run-1", "a", 0)
    assert detail["state"] == "starting_sandbox" and detail["max_turns"] == 5 and detail["first_t"] == queued["t"]
    assert [h[0] for h in detail["history"]] == ["queued", "starting_sandbox"]
    assert not state.apply(queued)  # once
