"""The driver's CPU per recorded rollout: what one finished rollout costs the driver process between its agent worker's
reply and its row on disk.

At 100,000 rollouts in flight the rollouts of a wave end together and one driver records them all: its cost per row
is the record tail (issue 40). This measures that path alone, with the driver's own code: the worker's reply is built
as the tree's agent worker `collect` returns it (a list of `Finished`, or a `Batch` of them where the tree has one)
and serialized into frames by Dask's protocol as an actor's reply is, then the driver's side is timed per row: the
reply deserialized, the row added to a real ResultStore (Parquet part
files in a temporary dir, flushed as a run flushes), the page's fields (`final_fields`), the events sent (the tree's
own RolloutEvents.flush through a stand-in client: distributed's Client.log_event where the tree calls it, and the
scheduler call's message serialized by Dask's protocol as its comm does; no network, no scheduler) and the
`rollout_recorded` log line (structlog, to a file). All of it under the garbage collector's thresholds the driver
sets for a run (uni_agent.gc_policy), as the driver's own process runs it.

It uses only APIs that older trees have too, so `uni-agent bench --record-only --baseline REF` runs it with REF's
`uni_agent` and with this tree's, in one invocation. Run as a script it prints one JSON object:
`python -m uni_agent.bench.record_cost --rows 20000`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

# One rollout as the simulation's agent makes it: a task prompt, 4 execute_bash turns with their output, submit.
TURNS = 4


def _messages(i: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent working in a sandbox. " * 20},
        {"role": "user", "content": f"Task {i}: fix the failing test, then submit. " * 4}]
    for turn in range(TURNS):
        call = {"id": f"call_{turn}", "type": "function",
                "function": {"name": "execute_bash", "arguments": '{"command": "echo hello && ls"}'}}
        messages.append({"role": "assistant", "content": "Let me run the command.", "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": "hello\nREADME.md\nsrc\ntests\n"})
    messages.append({"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]})
    return messages


def _batch_type() -> Any:
    """What the tree's driver and workers wrap a batch of specs or outcomes in: its `Batch`, or the list itself in a
    tree from before Batch."""
    try:
        from uni_agent.episode.rollout import Batch
    except ImportError:
        return list
    return Batch


def _replies(rows: int, batch: int) -> list[list[bytes]]:
    """The workers' `collect` replies, as Dask's protocol frames them on the way to the driver."""
    from distributed.protocol import dumps, to_serialize

    from uni_agent.episode.exit_reason import ExitReason
    from uni_agent.episode.rollout import Finished, RolloutResult

    wrap = _batch_type()

    def frames(results: list[Any]) -> list[bytes]:
        return [bytes(f) for f in dumps({"status": "OK", "result": to_serialize(wrap(results))})]

    replies, results = [], []
    for i in range(rows):
        result = RolloutResult(run_id="bench", instance_id=f"sim-{i // 4:06d}", rollout=i % 4, data_source="bench",
                               agent_name="sim", exit_reason=ExitReason.SUBMITTED, messages=_messages(i),
                               num_turns=TURNS + 1, llm_s=100.0, tools_s=0.25, total_s=100.3, worker="tcp://w:1",
                               started_at=time.time(), finished_at=time.time())
        results.append(Finished(result.key, result))
        if len(results) == batch:
            replies.append(frames(results))
            results = []
    if results:
        replies.append(frames(results))
    return replies


def handout_us_per_spec(rows: int, batch: int) -> float:
    """The driver's CPU per rollout handed out: its spec serialized into frames by Dask's protocol as the mailbox's
    `start_rollouts` call sends it (a list, or a `Batch` where the tree has one), `batch` specs a call."""
    from distributed.protocol import dumps, to_serialize

    from uni_agent.bench.simulate import SimOptions, write_inputs
    from uni_agent.config import AgentConfigs
    from uni_agent.episode.rollout import RolloutSpec

    wrap = _batch_type()
    with tempfile.TemporaryDirectory(prefix="uni-agent-handout-cost-") as tmp:
        _, config, _ = write_inputs(Path(tmp), SimOptions(in_flight=[4]), 4)  # the simulation's own agent config
        agents = AgentConfigs.load(config)
    # the simulation's rows carry no tools_kwargs, so every spec shares the agent's one validated config, as in its run
    agent = agents.for_row("sim", {}, "bench")
    specs = [RolloutSpec(run_id="bench", instance_id=f"sim-{i // 4:06d}", rollout=i % 4, data_source="bench",
                         row_index=i // 4, prompt=_messages(i)[:2], agent=agent) for i in range(rows)]
    started = time.process_time()
    for i in range(0, rows, batch):
        dumps({"op": "actor_execute", "args": [to_serialize(wrap(specs[i:i + batch]))]})  # as distributed.actor sends
    return (time.process_time() - started) / rows * 1e6


class _SchedulerCall:
    """`client.scheduler`: its log_event call serializes the message as Dask's comm does before writing it."""

    async def log_event(self, topic: Any, msg: Any) -> None:
        from distributed.protocol import dumps

        dumps({"op": "log_event", "topic": topic, "msg": msg, "reply": True})


class _ClientStandIn:
    """What RolloutEvents sends through: distributed's own Client.log_event (bound to this object, so its check of
    the message runs wherever a tree calls it) over _SchedulerCall."""

    def __init__(self) -> None:
        from distributed import Client

        self.scheduler = _SchedulerCall()
        self.log_event = functools.partial(Client.log_event, self)

    def sync(self, call: Any, *args: Any, **kwargs: Any) -> Any:  # an asynchronous Client's sync: the coroutine
        return call(*args, **kwargs)


def _drivers_collector() -> Any:
    """The garbage collector's thresholds the tree's driver runs with (its `full_collections_rare`), or none where
    the tree has no such policy: with Python's defaults the replies' unpickling measured 18 us a row, 6.7 with the
    driver's (the full collections walk every row held so far)."""
    try:
        from uni_agent.gc_policy import full_collections_rare
    except ImportError:
        return contextlib.nullcontext()
    return full_collections_rare()


def measure(rows: int, batch: int, out_dir: Path | None = None) -> dict[str, Any]:
    """The figures; the rows go to `out_dir` (kept) or a temporary dir (removed)."""
    with _drivers_collector():
        return _measure(rows, batch, out_dir)


def _measure(rows: int, batch: int, out_dir: Path | None) -> dict[str, Any]:
    import structlog
    from distributed.protocol import loads

    from uni_agent.driver.progress import RolloutEvents, final_fields
    from uni_agent.driver.results import ResultStore
    from uni_agent.events import rollout_event
    from uni_agent.logs import configure_logging

    replies = _replies(rows, batch)
    with tempfile.TemporaryDirectory(prefix="uni-agent-record-cost-") as scratch:
        tmp = out_dir or Path(scratch)
        configure_logging(tmp / "logs", "driver")
        log = structlog.get_logger("uni_agent.driver")
        store = ResultStore(tmp / "out", flush_every=16, flush_s=1.0)
        parts: dict[str, float] = dict.fromkeys(("reply", "row", "page_fields", "event_send", "log_line"), 0.0)
        sender = RolloutEvents(_ClientStandIn())  # type: ignore[arg-type]
        loop = asyncio.new_event_loop()
        started = time.process_time()
        for reply in replies:
            t = time.process_time()
            reply_value = loads(reply)["result"]
            finished = getattr(reply_value, "items", reply_value)
            parts["reply"] += time.process_time() - t
            events = []
            for outcome in finished:
                result = outcome.unwrap()
                t0 = time.process_time()
                store.add(result)
                t1 = time.process_time()
                events.append(rollout_event(result.run_id, result.instance_id, result.rollout, "done",
                                            **final_fields(result)))
                t2 = time.process_time()
                log.info("rollout_recorded", instance_id=result.instance_id, rollout=result.rollout,
                         reward=result.reward, exit_reason=result.exit_reason)
                t3 = time.process_time()
                parts["row"] += t1 - t0
                parts["page_fields"] += t2 - t1
                parts["log_line"] += t3 - t2
            t = time.process_time()
            sender.outbox.extend(events)
            loop.run_until_complete(sender.flush())
            parts["event_send"] += time.process_time() - t
        store.finish()
        total = time.process_time() - started
        loop.close()
        if sender.sent_messages == 0:
            raise RuntimeError("no event message was sent: the measurement did not reach the send")
        written = sum(1 for _ in (tmp / "out" / "results").glob("part-*.parquet"))
    return {"rows": rows, "batch": batch, "us_per_row": total / rows * 1e6, "part_files": written,
            "handout_us_per_spec": handout_us_per_spec(rows, batch),
            "results": str(tmp / "out" / "results") if out_dir else None,
            "parts_us_per_row": {k: v / rows * 1e6 for k, v in parts.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=500, help="rollouts in one collect reply (500)")
    args = parser.parse_args()
    print(json.dumps(measure(args.rows, args.batch)))


if __name__ == "__main__":
    main()
