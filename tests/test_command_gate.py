"""The command gate (uni_agent/sandbox/command_gate.py): a burst of commands begins in order, N at a time, and a long
command lets the next one begin after its hold. The gate alone on asyncio, then on real local sandboxes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from test_sandbox_local import repo, run, sandbox  # noqa: F401 - repo: a fixture

from uni_agent.sandbox import ExecResult
from uni_agent.sandbox.command_gate import CommandGate, command_gate


def timed(log: list[tuple[str, float, float]], name: str, seconds: float):
    async def command() -> ExecResult:
        began = time.monotonic()
        await asyncio.sleep(seconds)
        log.append((name, began, time.monotonic()))
        return ExecResult(stdout=b"", stderr=b"", exit_code=0, timed_out=False, duration_s=seconds)
    return command


def test_a_burst_begins_first_come_first_served_one_slot_at_a_time() -> None:
    gate = CommandGate(1, hold_s=30)
    log: list[tuple[str, float, float]] = []

    async def main() -> list[ExecResult]:
        return await asyncio.gather(*(gate.run(timed(log, f"c{i}", 0.05)) for i in range(5)))

    results = run(main())
    assert [name for name, _, _ in sorted(log, key=lambda e: e[1])] == ["c0", "c1", "c2", "c3", "c4"]
    for (_, _, ended), (_, began, _) in zip(log, log[1:]):
        assert began >= ended - 0.001  # none overlaps the one before it
    # what a command cost its rollout includes its wait for the slot: the last waited for four before it
    assert results[4].duration_s >= 0.2 > results[0].duration_s
    assert gate.cap.held == 0


def test_two_slots_run_two_at_once() -> None:
    gate = CommandGate(2, hold_s=30)
    log: list[tuple[str, float, float]] = []

    async def main() -> None:
        await asyncio.gather(*(gate.run(timed(log, f"c{i}", 0.2)) for i in range(4)))

    started = time.monotonic()
    run(main())
    took = time.monotonic() - started
    assert gate.cap.max_held == 2
    assert 0.4 <= took < 0.7, took  # two rounds of two, not four of one nor one of four


def test_a_long_command_lets_the_next_begin_after_its_hold() -> None:
    gate = CommandGate(1, hold_s=0.05)
    log: list[tuple[str, float, float]] = []

    async def main() -> None:
        await asyncio.gather(gate.run(timed(log, "long", 1.0)), gate.run(timed(log, "short", 0.01)))

    run(main())
    ends = {name: (began, ended) for name, began, ended in log}
    long_began, long_ended = ends["long"]
    short_began, short_ended = ends["short"]
    assert 0.04 <= short_began - long_began < 0.5
    assert short_ended < long_ended  # it ran beside the long one, not after it
    assert gate.cap.held == 0


def test_a_cancelled_command_gives_its_slot_back() -> None:
    gate = CommandGate(1, hold_s=30)
    log: list[tuple[str, float, float]] = []

    async def main() -> None:
        running = asyncio.ensure_future(gate.run(timed(log, "running", 10)))
        waiting = asyncio.ensure_future(gate.run(timed(log, "waiting", 10)))
        await asyncio.sleep(0.05)
        waiting.cancel()  # cancelled in the queue
        running.cancel()  # cancelled while it holds the slot
        await asyncio.gather(running, waiting, return_exceptions=True)
        assert gate.cap.held == 0
        began = time.monotonic()
        await gate.run(timed(log, "next", 0))
        assert time.monotonic() - began < 0.05  # nothing left holding the slot

    run(main())
    assert [name for name, _, _ in log] == ["next"]


def test_no_slots_is_no_gate_and_alike_sandboxes_share_one() -> None:
    assert command_gate(0, 0.02) is None
    assert command_gate(2, 0.02) is command_gate(2, 0.02)
    assert command_gate(2, 0.02) is not command_gate(3, 0.02)
    with pytest.raises(ValueError):
        CommandGate(1, hold_s=0)


def windows(outputs: list[str]) -> list[tuple[float, float]]:
    return [tuple(float(x) for x in out.split()) for out in outputs]  # type: ignore[misc]


def test_sandboxes_of_one_process_take_their_commands_through_the_gate(repo: Path) -> None:  # noqa: F811
    """Real sandboxes: with one slot held for the whole command, two sandboxes' commands run one after the other;
    with the hold shorter than the command, side by side."""
    command = "date +%s.%N; sleep 0.4; date +%s.%N"

    async def both(**config: object) -> list[str]:
        async with sandbox(repo, name="a", **config) as a, sandbox(repo, name="b", **config) as b:
            results = await asyncio.gather(a.exec(command, 10), b.exec(command, 10))
        assert all(r.exit_code == 0 for r in results), [r.output for r in results]
        return [r.stdout.decode() for r in results]

    (a0, a1), (b0, b1) = sorted(windows(run(both(command_slots=1, command_hold_s=30))))
    assert b0 >= a1 - 0.01, (a0, a1, b0, b1)
    (a0, a1), (b0, b1) = sorted(windows(run(both(command_slots=1, command_hold_s=0.05))))
    assert b0 < a1, (a0, a1, b0, b1)
    (a0, a1), (b0, b1) = sorted(windows(run(both(command_slots=0))))
    assert b0 < a1, (a0, a1, b0, b1)
