"""What the driver sends and writes per finished rollout, batched (issue 27): rollout events go to a real Dask
scheduler a burst at a time, never one round trip per rollout, and a burst of results makes few Parquet part files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from distributed import Client, LocalCluster

from uni_agent.driver.progress import MESSAGE_CHARS, PER_MESSAGE, SENDS_IN_FLIGHT, RolloutEvents, message_size
from uni_agent.driver.results import ResultStore
from uni_agent.episode.rollout import RolloutResult
from uni_agent.events import PAGE_TRAJECTORIES, TOPIC, unbatch


def _result(i: int) -> RolloutResult:
    return RolloutResult(run_id="r", instance_id=f"t{i}", rollout=0, data_source="d", agent_name="a",
                         exit_reason="submitted")


class _Spec:  # the four fields RolloutEvents reads of a RolloutSpec
    def __init__(self, i: int):
        self.run_id, self.instance_id, self.rollout = "r", f"t{i}", 0


def test_finished_rollouts_reach_the_scheduler_in_a_few_messages():
    async def main() -> list:
        async with LocalCluster(n_workers=0, processes=False, asynchronous=True, dashboard_address=":0",
                                silence_logs=logging.ERROR) as cluster, \
                Client(cluster, asynchronous=True) as client:
            events = RolloutEvents(client, flush_s=0.05)
            for i in range(1500):  # a wave finishing: none of these calls waits for the scheduler
                events.finished(_Spec(i), _result(i))
            assert len(events.outbox) == 1500 and events.sent_messages == 0
            await asyncio.sleep(0.5)  # the sender wakes after flush_s and sends it all
            assert events.outbox == [] and events.sent_messages == 2  # 1,000 + 500
            events.state(_Spec(0), "verifying")
            await events.close()  # what is left goes at once
            assert events.sent_messages == 3
            return await client.get_events(TOPIC)

    logged = asyncio.run(main())
    assert len(logged) == 3
    sent = [e for _, msg in logged for e in unbatch(msg)]  # the first two messages travel together: either order
    assert sorted(e["state"] for e in sent) == ["done"] * 1500 + ["verifying"] and sent[-1]["state"] == "verifying"
    # only the trajectories the page keeps (PAGE_TRAJECTORIES, the latest) travel; the others are marked evicted
    kept = {e["instance_id"] for e in sent if "messages" in e}
    assert kept == {f"t{i}" for i in range(1500 - PAGE_TRAJECTORIES, 1500)}
    assert all(e.get("trajectory") == "evicted" for e in sent if e["state"] == "done" and e["instance_id"] not in kept)


class _SlowScheduler:
    """A Client as RolloutEvents uses it (its scheduler's log_event call), each message taking `delay_s` to arrive;
    it counts the messages on their way at once."""

    def __init__(self, delay_s: float) -> None:
        self.scheduler = self
        self.delay_s = delay_s
        self.in_flight = self.most = 0
        self.events: list[dict] = []

    async def log_event(self, topic: str, msg: dict) -> None:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.events.extend(unbatch(msg))
        self.in_flight -= 1


def test_a_burst_goes_out_in_a_few_messages_on_their_way_at_once():
    """While the scheduler folds one message the driver packs and sends the next: at most SENDS_IN_FLIGHT at once,
    every event sent once."""
    client = _SlowScheduler(0.05)

    async def main() -> int:
        events = RolloutEvents(client, flush_s=3600)  # type: ignore[arg-type]
        for i in range(PER_MESSAGE * 5 + 7):
            events.state(_Spec(i), "running", turn=1)
        await events.close()
        return events.sent_messages

    assert asyncio.run(main()) == 6
    assert client.most == SENDS_IN_FLIGHT
    assert sorted(int(e["instance_id"][1:]) for e in client.events) == list(range(PER_MESSAGE * 5 + 7))


def test_close_waits_for_the_messages_the_send_loop_had_on_their_way():
    """The run's end (close) cancels the send loop mid-burst: what it had on its way still arrives before close
    returns (the client closes right after), and what it had not sent yet goes with close's own flush."""
    client = _SlowScheduler(0.2)

    async def main() -> int:
        events = RolloutEvents(client, flush_s=0.01)  # type: ignore[arg-type]
        for i in range(PER_MESSAGE * SENDS_IN_FLIGHT):
            events.state(_Spec(i), "running", turn=1)
        await asyncio.sleep(0.1)  # the send loop has every message on its way, none arrived
        assert not events.outbox and not client.events
        await events.close()
        return len(client.events)

    assert asyncio.run(main()) == PER_MESSAGE * SENDS_IN_FLIGHT


def test_a_message_holds_at_most_its_share_of_trajectory_text():
    big = {"messages": "x" * (MESSAGE_CHARS // 3)}
    assert message_size([big] * 10) == 3  # a fourth would pass MESSAGE_CHARS
    assert message_size([{"messages": "x" * (MESSAGE_CHARS * 2)}] * 2) == 1  # one too large still goes, alone
    assert message_size([{}] * (PER_MESSAGE + 5)) == PER_MESSAGE
    assert message_size([{}] * 7) == 7


def test_a_burst_of_results_makes_one_part_file_a_flush_s(tmp_path):
    store = ResultStore(tmp_path, flush_every=16, flush_s=3600)
    for i in range(100):
        store.add(_result(i))
    assert len(list((tmp_path / "results").glob("part-*.parquet"))) == 1  # the first 16; the rest wait
    assert store.flush_due()  # 84 held back for the caller to flush later
    store.flush()
    assert len(list((tmp_path / "results").glob("part-*.parquet"))) == 2
    assert len(store.read()) == 100
    quick = ResultStore(tmp_path / "quick", flush_every=16, flush_s=0)
    for i in range(100):
        quick.add(_result(i))
    assert len(list((tmp_path / "quick" / "results").glob("part-*.parquet"))) == 6  # every 16, as before
    assert len(quick._buffer) == 4


def test_rows_held_back_reach_disk_about_flush_s_later(tmp_path):
    from uni_agent.driver.dispatch import Dispatcher

    store = ResultStore(tmp_path, flush_every=2, flush_s=0.05)
    dispatcher = Dispatcher.__new__(Dispatcher)  # only the store and the timer are used here
    dispatcher.store, dispatcher._flush_timer = store, None

    async def main() -> tuple[int, int]:
        for i in range(5):
            store.add(_result(i))  # the first 2 go at once; 3 wait: the last part file is younger than flush_s
            dispatcher._flush_later()
        held = len(store._buffer)
        await asyncio.sleep(0.2)
        return held, len(store._buffer)

    assert asyncio.run(main()) == (3, 0)
    assert len(store.read()) == 5


def test_events_go_to_the_scheduler_without_the_clients_checking_walk(monkeypatch):
    """RolloutEvents calls the scheduler's `log_event` itself: Client.log_event first walks the whole message in
    Python (2-3 us a finished rollout's event on the driver's loop). Events still arrive, in order, and as plain
    msgpack values whatever a caller passed (a numpy number, an object): nothing reaches the scheduler pickled."""
    import numpy as np

    async def refuse(*_, **__):
        raise AssertionError("Client.log_event was called")

    monkeypatch.setattr(Client, "log_event", refuse)

    async def main() -> tuple[list, int]:
        async with LocalCluster(n_workers=0, processes=False, asynchronous=True, dashboard_address=":0",
                                silence_logs=logging.ERROR) as cluster, \
                Client(cluster, asynchronous=True) as client:
            events = RolloutEvents(client, flush_s=0.05)
            for i in range(3):
                events.finished(_Spec(i), _result(i))
            await events.flush()
            events.state(_Spec(3), "running", turn=np.int64(2), share=np.float64(0.5), ok=np.bool_(True),
                         odd=object())
            await events.close()
            return await client.get_events(TOPIC), events.sent_messages

    logged, sent_messages = asyncio.run(main())
    sent = [e for _, msg in logged for e in unbatch(msg)]
    assert [(e["instance_id"], e["state"]) for e in sent] == [("t0", "done"), ("t1", "done"), ("t2", "done"),
                                                              ("t3", "running")]
    running = sent[-1]
    assert (type(running["turn"]), type(running["share"]), type(running["ok"]), type(running["odd"])) == (
        int, float, bool, str) and running["odd"].startswith("<object object")
    assert sent_messages == 2


def test_a_runs_rollouts_begin_a_slice_at_a_time_and_a_cancel_leaves_none_running():
    """At a run's start the dispatcher makes its rollouts' tasks START_SLICE at a time: what the first rollout
    schedules (its hand-out) runs after the first slice began, not after every rollout of the run did. Cancelled
    while making them, it leaves no task behind."""
    from uni_agent.driver.dispatch import START_SLICE, Dispatcher

    dispatcher = Dispatcher.__new__(Dispatcher)  # only run_one is used here
    began: list[int] = []
    handed_out_after: list[int] = []

    async def run_one(spec: int) -> None:
        began.append(spec)
        if spec == 0:  # the loop's next turn, as the mailbox's send waits for
            asyncio.get_running_loop().call_soon(lambda: handed_out_after.append(len(began)))
        await asyncio.sleep(0.01)

    dispatcher.run_one = run_one  # type: ignore[method-assign]
    asyncio.run(dispatcher._run_all(list(range(5 * START_SLICE))))
    assert sorted(began) == list(range(5 * START_SLICE))
    assert handed_out_after == [START_SLICE]  # all 5,000 when made at once

    async def cancelled() -> list[asyncio.Task]:
        began.clear()
        run = asyncio.ensure_future(dispatcher._run_all(list(range(5 * START_SLICE))))
        while len(began) < START_SLICE:
            await asyncio.sleep(0)
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await asyncio.sleep(0)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(cancelled()) == [] and len(began) < 5 * START_SLICE


def test_the_last_events_travel_while_the_agent_workers_close():
    """At a session's end the dispatcher closes its events and its pool's actors together: the actors' close begins
    while the last messages are still on their way (one after the other they cost both waits), and close returns
    once both ended, every event delivered."""
    from uni_agent.driver.dispatch import Dispatcher

    client = _SlowScheduler(0.3)
    seen_at_pool_close: list[int] = []

    class _Pool:
        async def close(self) -> None:
            seen_at_pool_close.append(len(client.events))
            await asyncio.sleep(0.3)

    async def main() -> int:
        dispatcher = Dispatcher.__new__(Dispatcher)  # only close is used here
        dispatcher.pool = _Pool()
        dispatcher.events = RolloutEvents(client, flush_s=3600)  # type: ignore[arg-type]
        for i in range(PER_MESSAGE * 2):
            dispatcher.events.state(_Spec(i), "done")
        await dispatcher.close()
        return len(client.events)

    assert asyncio.run(main()) == PER_MESSAGE * 2
    assert seen_at_pool_close == [0]  # none of the events had arrived when the actors' close began
