"""`uni-agent bench --simulate`, tiny: real `dask scheduler` and `dask worker` processes, the driver as a `uni-agent
run` process, the page and Parquet; the sandbox is the in-memory stand-in (said so: it runs nothing) and the model is
the endpoint pool. No timing asserts: the figures must exist and the results must be complete and unique."""

from __future__ import annotations

import asyncio
import os
import sys

import pytest

from uni_agent.bench.simulate import SimOptions, ideal_makespan, run_simulation
from uni_agent.bench.simulate_processes import ProcessCluster
from uni_agent.config import AgentConfigs, ConfigError, EnvConfig
from uni_agent.sandbox.memory import MemoryDeploymentConfig
from uni_agent.sandbox.start import workspace_patch
from uni_agent.worker_monitor import MONITOR_CALLBACK, MONITOR_INTERVAL_MS


def test_memory_sandbox_takes_its_time_and_answers_canned_output():
    config = MemoryDeploymentConfig(command_s=0.02, output="hi\n")

    async def scenario():
        sandbox = config.build({}, name="m")
        async with sandbox:
            loop = asyncio.get_running_loop()
            started = loop.time()
            result = await sandbox.exec("anything at all", 60)
            took = loop.time() - started
            patch = await workspace_patch(sandbox)
        return result, took, patch, sandbox

    result, took, patch, sandbox = asyncio.run(scenario())
    assert (result.output, result.exit_code, result.timed_out) == ("hi\n", 0, False)
    assert took >= 0.02
    assert patch == ""  # the stand-in changes no file
    assert sandbox.commands == 2 and not sandbox.running


def test_memory_deployment_is_validated_like_the_others(tmp_path):
    assert EnvConfig.model_validate({"deployment": {"type": "memory"}}).deployment.command_s == 0.05
    path = tmp_path / "a.yaml"
    path.write_text("- name: a\n  env:\n    deployment:\n      type: memory\n      command_sec: 1\n")
    with pytest.raises(ConfigError, match="command_sec"):
        AgentConfigs.load(path)


def test_the_simulations_workers_load_the_worker_preload_as_the_slurm_recipes_do(tmp_path):
    """Without it the simulated workers sampled Dask's system monitor every 0.5 s and imported the rollouts' modules
    in the first wave: figures of a worker no run starts."""

    def preloaded(dask_worker) -> tuple[float, bool]:
        return dask_worker.periodic_callbacks[MONITOR_CALLBACK].callback_time, "uni_agent.episode.worker" in sys.modules

    with ProcessCluster(1, tmp_path / "cluster", dict(os.environ)) as cluster:
        assert list(cluster.client.run(preloaded).values()) == [(MONITOR_INTERVAL_MS, True)]


def test_tiny_simulation_records_every_rollout_once(tmp_path):
    options = SimOptions(in_flight=[8, 16], workers=2, delay_s=0.2, turns=2, command_s=0.01, out_dir=tmp_path)
    lines: list[str] = []
    report = run_simulation(options, echo=lines.append)
    assert len(report["rows"]) == 2
    for row in report["rows"]:
        assert row["driver_exit"] == 0, (tmp_path / f"c{row['in_flight']}" / "driver.log").read_text()[-3000:]
        assert (row["recorded"], row["lost"], row["duplicates"]) == (row["rollouts"], 0, 0)
        assert row["submitted"] == row["rollouts"]
        assert row["events"] >= row["rollouts"] * 3  # queued, starting_sandbox, running x turns, done
        assert row["page_rollouts_held"] == row["rollouts"]
        assert row["page_state_kb_max"] > 0 and row["part_files"] >= 1 and row["parquet_bytes"] > 0
        assert set(row["worker_cores"]) == {"sim-0", "sim-1"}
        assert row["peak_rss_mib"]["scheduler"] > 0 and row["peak_rss_mib"]["driver"] > 0
        assert row["ideal_s"] == ideal_makespan(options)
        assert row["endpoint"]["requests"] == row["rollouts"] * 3  # 2 turns + submit
        phases = dict(row["driver_phases"])  # the driver's own steps, from its log, in the order they happened
        names = [name for name, _ in row["driver_phases"]]
        # the rollouts are queued as soon as the agent workers started, while the engines start: those two race
        assert names[:4] == ["inputs_loaded", "results_read", "connected", "agent_workers_started"], names
        assert sorted(names[4:6]) == ["engines_ready", "queued"], names
        # the last events travel while the agent workers close: those two race as well
        assert names[6] == "rollouts_finished" and sorted(names[7:9]) == ["agent_workers_closed", "events_sent"]
        assert names[9:] == ["engines_stopped", "session_closed", "summary_written"], names
        assert 0 < phases["queued"] <= row["first_started_s"] + 0.5 and phases["rollouts_finished"] < row["wall_s"]
    assert any(line.startswith("growth from 8 to 16 rollouts") for line in lines)
    assert any("0 lost, 0 duplicate keys" in line for line in lines)
    assert any(line.strip().startswith("driver's steps: inputs_loaded") for line in "\n".join(lines).splitlines())


def test_a_batch_of_queued_events_folds_like_the_events_one_by_one():
    from uni_agent.dashboard.state import DashboardState
    from uni_agent.events import batch_event, rollout_event, unbatch

    events = [rollout_event("r", f"i{k}", 0, "queued", max_turns=3) for k in range(5)]
    one, batched = DashboardState(), DashboardState()
    for event in events:
        one.apply(event)
    assert batched.apply(batch_event(events))
    assert not batched.apply(batch_event([]))  # nothing in it: nothing accepted
    assert batched.snapshot("r")["counts"] == one.snapshot("r")["counts"] and one.snapshot("r")["counts"]["queued"] == 5
    assert batched.totals.events == one.totals.events == 5
    assert unbatch(events[0]) == [events[0]] and unbatch(batch_event(events)) == events
    assert unbatch({"kind": "batch", "events": tuple(events)}) == events  # msgpack may make the list a tuple
