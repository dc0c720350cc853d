"""The run's start_rate (uni_agent/driver/pacing.py): rollouts started evenly spaced instead of all at once.

The pacer alone on a real event loop, then a real run (LocalCluster, bubblewrap sandboxes, a ScriptedLLM endpoint)
whose rows show the spacing, and the setting's checks. Sleeps never return early, so the spacing is asserted as a
lower bound only: a loaded machine makes it wider, never narrower."""

import asyncio
import time

import pandas as pd
import pytest
from conftest import AGENT_CONFIG

from uni_agent import AgentConfigs, run
from uni_agent.config import ConfigError
from uni_agent.driver.pacing import StartPacer
from uni_agent.settings import load_settings
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message


async def _start_times(pacer: StartPacer, starts: int) -> list[float]:
    times: list[float] = []

    async def one() -> None:
        await pacer.wait()
        times.append(time.monotonic())

    t0 = time.monotonic()
    await asyncio.gather(*(one() for _ in range(starts)))
    return [t - t0 for t in sorted(times)]


def test_starts_asked_together_go_one_interval_apart():
    times = asyncio.run(_start_times(StartPacer(50.0), 8))  # 20 ms apart
    assert times[0] < 0.015, times  # the first at once
    # Each start no earlier than its slot, i intervals after the first (asyncio's timers may fire up to a clock tick
    # early; never a whole interval). Not the gaps between starts: one woken late (a loaded machine) and the next on
    # time are less than an interval apart, and both kept their slots.
    assert all(t >= i * 0.02 - 0.002 for i, t in enumerate(times)), times


def test_a_start_after_a_quiet_spell_goes_at_once_and_rate_0_never_waits():
    async def scenario() -> tuple[float, float]:
        pacer = StartPacer(20.0)  # 50 ms apart
        await pacer.wait()
        await asyncio.sleep(0.2)  # quiet for four intervals: no debt of slots is owed, none is banked either
        t = time.monotonic()
        await pacer.wait()
        after_quiet = time.monotonic() - t
        t = time.monotonic()
        await pacer.wait()  # straight after: one interval
        return after_quiet, time.monotonic() - t

    after_quiet, next_one = asyncio.run(scenario())
    assert after_quiet < 0.01
    assert next_one >= 0.045
    unpaced = asyncio.run(_start_times(StartPacer(0.0), 100))
    assert unpaced[-1] < 0.05, unpaced[-1]


def test_start_rate_is_checked_and_named_by_its_flag():
    assert load_settings(start_rate=12.5).start_rate == 12.5
    with pytest.raises(ConfigError, match="--start-rate"):
        load_settings(flags={"start_rate": "--start-rate"}, start_rate=-1)


def test_a_run_with_a_start_rate_starts_its_rollouts_spread(rows, tmp_path, dask_client):
    """6 rollouts at 4 a second: the last starts at least 5 intervals (1.25 s) after the first; without the rate, all
    of them are handed out within a fraction of that (the control half, same cluster and endpoint)."""
    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"interaction": {"tools_in": "api", "constrain_tool_calls": False}})

    def spread(rate: float, out: str) -> float:
        run(rows[:6], agents, client=dask_client, engine="external", base_url=server.base_url,
            model_name="scripted", agent_workers=2, output_dir=str(tmp_path / out), progress=False, n=1,
            verify=False, start_rate=rate)
        results = pd.read_parquet(tmp_path / out / "results")
        assert len(results) == 6 and (results.exit_reason == "submitted").all(), results[["exit_reason", "error"]]
        return float(results.started_at.max() - results.started_at.min())

    with ScriptedLLM(lambda body: tool_call_message("submit", {})) as server:
        paced = spread(4.0, "paced")
        unpaced = spread(0.0, "unpaced")
    assert paced >= 5 * 0.25 - 0.05, paced
    assert unpaced < paced / 2, (unpaced, paced)
