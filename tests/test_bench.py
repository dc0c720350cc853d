"""`uni-agent bench` at a tiny scale: the table is printed and its figures are present and sane.

No timing targets here (a timed test flakes on a shared machine); the targets are printed by the benchmark itself.
"""

import json
import math

import pytest

from uni_agent.bench.cpu_split import ROLES, split_line
from uni_agent.bench.endpoint import MINI_SUBMIT, BenchPolicy
from uni_agent.bench.main import BenchOptions, run_bench
from uni_agent.bench.measure import FDS_PER_ROLLOUT_SIMULATED, fds_needed, fewest_processes, ideal_makespan


def test_endpoint_policy_speaks_both_agents_formats():
    policy = BenchPolicy(turns=2, command="echo hi")
    ours = {"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "execute_bash"}}]}
    call = policy(ours)["tool_calls"][0]["function"]
    assert call["name"] == "execute_bash" and json.loads(call["arguments"]) == {"command": "echo hi"}
    ours["messages"] += [{"role": "assistant", "content": ""}] * 2
    assert policy(ours)["tool_calls"][0]["function"]["name"] == "submit"
    mini = {"messages": [{"role": "user", "content": "x"}], "tools": [{"function": {"name": "bash"}}]}
    assert json.loads(policy(mini)["tool_calls"][0]["function"]["arguments"]) == {"command": "echo hi"}
    mini["messages"] += [{"role": "assistant", "content": ""}] * 2
    assert json.loads(policy(mini)["tool_calls"][0]["function"]["arguments"]) == {"command": MINI_SUBMIT}


def test_ideal_makespan():
    assert ideal_makespan(rollouts=8, concurrency=4, llm_calls_per_rollout=3, delay_s=1) == 6
    assert ideal_makespan(rollouts=2, concurrency=4, llm_calls_per_rollout=3, delay_s=1) == 3  # one rollout's length


def test_open_files_needed_count_the_busiest_process():
    # The README's 20,000 point (10 workers, 4 endpoint processes) fits a hard limit of 20,000; one worker would not.
    assert fds_needed(20000, 10, 4) == 8 * 2000 + 1024 == 17024
    assert fds_needed(20000, 10, 1) == 2 * 20000 + 1024  # one endpoint process holds every connection
    assert fds_needed(1000, 1) == 8 * 1000 + 1024
    assert fds_needed(20000, 10, 4, FDS_PER_ROLLOUT_SIMULATED) == 2 * 5000 + 1024  # the endpoints hold the most


def test_the_fewest_processes_that_fit_a_hard_limit():
    # Issue 40: 100,000 in flight on a machine whose hard limit is 20,000 (ran with 48 workers and 12 endpoints).
    workers, endpoints = fewest_processes(100_000, 20_000)
    assert (workers, endpoints) == (43, 11)
    assert fds_needed(100_000, workers, endpoints) <= 20_000 < fds_needed(100_000, workers - 1, endpoints)
    assert fds_needed(100_000, workers, endpoints - 1) > 20_000
    simulated = fewest_processes(100_000, 20_000, FDS_PER_ROLLOUT_SIMULATED)
    assert simulated == (11, 11) and fds_needed(100_000, *simulated, FDS_PER_ROLLOUT_SIMULATED) <= 20_000


# Each command burns 0.1 s of CPU in its sandbox: the sandbox column must hold at least that (issue 40: it read 0.00
# once the sandboxes ran in a fork server that no worker reaps during the run).
BURN = ("python3 -c 'import time; t = time.process_time(); "
        "any(time.process_time() - t > 0.1 for _ in iter(int, 1))'")


def test_bench_tiny_run_prints_a_sane_table(tmp_path):
    lines = []
    options = BenchOptions(concurrency=[4], workers=[1], turns=2, delay_s=0.1, waves=2, peer=False, command=BURN,
                           out_dir=tmp_path / "bench", json_path=tmp_path / "bench.json")
    report = run_bench(options, echo=lines.append)
    text = "\n".join(lines)
    assert "makespan s" in text and "fw CPU ms/turn" in text and "targets (uni-agent):" in text
    assert any(line.strip().startswith("uni-agent |") for line in lines), text
    [row] = report["rows"]
    assert row["system"] == "uni-agent" and row["workers"] == 1 and row["concurrency"] == 4
    assert row["rollouts"] == 8 and row["ok"] == 8, row["errors"]
    assert (row["recorded"], row["lost"], row["duplicates"]) == (8, 0, 0)  # read from the part files themselves
    assert "lost/dup" in text and " 0/0 " in next(line for line in lines if line.strip().startswith("uni-agent |"))
    assert row["llm_calls"] == 8 * 3 and row["commands"] == 8 * 2  # 2 execute_bash turns + submit, every rollout
    assert row["ideal_s"] == ideal_makespan(8, 4, 3, 0.1)
    assert row["makespan_s"] >= row["ideal_s"] and 0 < row["efficiency"] <= 1
    assert row["rollouts_per_min"] > 0
    assert row["framework_cpu_ms_per_turn"] > 0
    # 16 commands of 0.1 s CPU each (and their interpreters' start) over 24 model calls
    assert row["sandbox_cpu_ms_per_turn"] * row["llm_calls"] >= 0.95 * 16 * 100, row["sandbox_cpu_ms_per_turn"]
    # The machine's CPU covers the framework's and the sandboxes' (and the endpoint's, and what rusage misses).
    assert row["machine_cpu_ms_per_turn"] >= 0.9 * (row["framework_cpu_ms_per_turn"] + row["sandbox_cpu_ms_per_turn"])
    assert 0 < row["sandbox_start_p50_ms"] <= row["sandbox_start_p95_ms"]
    # what the first model call (0.1 s here) did not hide of the start: never more than the start itself
    assert 0 <= row["start_past_first_call_p95_ms"] <= max(0.0, row["sandbox_start_p95_ms"] - 100) + 1e-6
    assert "start past the first call's delay" in text
    # The run's fixed cost around its rollouts: positive, and less than the run (whose every call is 0.1 s).
    assert 0 < row["lead_in_s"] and 0 <= row["tail_s"] and row["lead_in_s"] + row["tail_s"] < row["makespan_s"] - 0.6
    assert "lead-in/tail s" in text
    # Where the time went: a rollout spends at least its commands' CPU (2 x 0.1 s) in them; the model calls' wait
    # past their delay is small but not negative; the worst is no better than the mean.
    assert row["commands_mean_s"] >= 0.2 * 0.95 and row["commands_max_s"] >= row["commands_mean_s"]
    assert -0.05 < row["model_late_mean_s"] <= row["model_late_max_s"]
    assert row["over_ideal_max_s"] >= row["over_ideal_mean_s"] >= row["commands_mean_s"] - 0.05
    assert "a rollout's time past the ideal, mean / worst" in text
    assert not math.isnan(row["peak_mib_per_rollout"]) and row["peak_mib_per_rollout"] >= 0
    # a worker holds its libraries, Dask's sockets and its rollouts' files: within the estimate, which sized the limit
    assert 10 < row["peak_fds_worker"] <= fds_needed(4, 1)
    assert any(line.startswith("open files: ") for line in lines) and "open files at peak: busiest worker" in text
    assert row["endpoint"]["requests"] == 8 * 3 and row["endpoint"]["processes"] == 1  # 4 in flight: one
    # The endpoint's own lag, apart from the model calls' wait past their delay: none of it below zero.
    assert 0 <= row["endpoint"]["late_mean_s"] <= row["endpoint"]["late_max_s"] < 0.5
    assert "endpoint: 1 process, 24 requests" in text
    assert "of the model calls' wait past their delay, the endpoint's own part" in text
    assert json.loads((tmp_path / "bench.json").read_text())["rows"][0]["ok"] == 8
    # Every target has a line: measured ones MET or NOT MET, the rest say they were not run.
    assert len(report["targets"]) == 7 and "not run" in report["targets"][1] and "not run" in report["targets"][-1]
    in_wave = next(t for t in report["targets"] if "start p95 <= 100 ms inside the runs" in t)
    assert f"c4/1w {row['sandbox_start_p95_ms']:.0f} ({row['start_past_first_call_p95_ms']:.0f})" in in_wave
    assert ("NOT MET" in in_wave) == (row["sandbox_start_p95_ms"] > 100)
    assert 0 < report["sandbox_start_alone"]["p50_ms"] <= report["sandbox_start_alone"]["p95_ms"]
    # The machine's CPU, split by process: every role measured, the sandboxes and workers did work, nothing negative
    # but "everything else" (the remainder, which other users' work on a shared machine can make anything).
    split = row["cpu_split_s"]
    assert set(split) == set(ROLES)
    assert split["workers"] > 0 and split["sandboxes"] > 0 and split["driver"] > 0
    assert all(split[k] >= 0 for k in ROLES if k != "everything else")
    line = next(line for line in lines if "machine CPU per turn" in line)
    assert line.strip() == split_line(split, row["llm_calls"])


def test_cpu_split_counts_a_workers_descendants_as_sandboxes():
    """Real processes below a stand-in "worker" (this test process) burn known CPU: a child 0.4 s, and a child's
    own child 0.3 s (reaped by that child, never by us). Both count for the sandboxes, once."""
    import os
    import subprocess
    import sys

    from uni_agent.bench.cpu_split import CpuSplit

    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < {}: pass\n"
    nested = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn.format(0.3)!r}])"
    with CpuSplit(os.getpid(), [], [os.getpid()], [], interval=0.1) as split:
        direct = subprocess.Popen([sys.executable, "-c", burn.format(0.4)])
        parent = subprocess.Popen([sys.executable, "-c", nested])
        direct.wait()
        parent.wait()
    seconds = split.seconds
    assert 0.65 <= seconds["sandboxes"] <= 1.5, seconds  # 0.7 s burnt, plus three interpreters' start
    assert seconds["sampler"] > 0 and set(seconds) == set(ROLES)
    # The machine's total (/proc/stat, counted per tick) and a process's times (scaled from its exact runtime) can
    # differ by a few ticks: the machine must hold the sandboxes' CPU within that.
    assert split.machine_s >= seconds["sandboxes"] - 0.05


def test_record_cost_records_every_row_and_splits_its_cpu(tmp_path):
    """python -m uni_agent.bench.record_cost: the rows are really written (Parquet part files read back) and the
    parts of the CPU per row are measured figures that add up to no more than the whole."""
    import pyarrow.parquet as pq

    from uni_agent.bench.record_cost import measure

    figures = measure(rows=300, batch=100, out_dir=tmp_path)
    assert figures["rows"] == 300 and figures["part_files"] >= 1
    assert pq.read_table(figures["results"], columns=["instance_id", "rollout"]).num_rows == 300
    parts = figures["parts_us_per_row"]
    assert all(v > 0 for v in parts.values()), parts
    assert sum(parts.values()) <= figures["us_per_row"] * 1.05


def test_connect_cost_times_connections_held_to_one_address():
    """python -m uni_agent.bench.connect_cost: each step's connections stay open (the range fills step by step) and
    the CPU per connect() is a measured figure; the open-file limit is back as it was afterwards."""
    import resource

    from uni_agent.bench.connect_cost import connect_costs

    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    rows = connect_costs(step=500, limit=1500)
    assert [held for held, _ in rows] == [500, 1000, 1500], rows
    assert all(0 < micros < 1e5 for _, micros in rows), rows
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == limits


def test_the_simulated_endpoint_spreads_over_loopback_addresses_past_the_ports_of_one():
    """One address holds at most 45% of the kernel's ephemeral ports in connections from this host (connect() walks
    every odd port once half the range is used): past that the endpoint listens on more loopback addresses, and
    every one of them answers."""
    import urllib.request

    from uni_agent.bench.endpoint_pool import EndpointPool
    from uni_agent.bench.measure import connections_per_address, endpoint_addresses, port_range

    per_address = connections_per_address()
    low, high = port_range()
    assert 1000 < per_address < (high - low + 1) / 2  # under the odd half, where each connect() stays cheap
    assert endpoint_addresses(per_address) == 1 and endpoint_addresses(per_address + 1) == 2
    with EndpointPool(1, 0.01, 1, "ls", addresses=2) as endpoint:
        urls = endpoint.base_url.split(",")
        assert [u.split("/")[2].split(":")[0] for u in urls] == ["127.0.0.1", "127.0.0.2"]
        for url in urls:
            body = json.dumps({"model": "scripted", "messages": [{"role": "user", "content": "go"}]}).encode()
            request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as answer:
                assert json.loads(answer.read())["choices"][0]["message"]["tool_calls"]
    assert endpoint.stats["requests"] == 2


def test_endpoint_lag_times_both_stand_in_endpoints_with_one_client():
    from uni_agent.bench.endpoint_lag import KINDS, measure

    for kind in KINDS:
        figures = measure(kind, in_flight=4, calls=3, delay_s=0.05)
        assert figures["endpoint"] == kind and figures["calls"] == 4 * 3
        # a reply never comes before its delay; the percentiles are in order
        assert -1.0 < figures["late_p50_ms"] <= figures["late_p95_ms"] <= figures["late_max_ms"] < 1000
        assert figures["endpoint_cpu_s"] > 0


def test_a_baseline_pair_runs_both_trees_at_one_start_rate():
    """--baseline with one --start-rate gives both trees' sweeps that rate (none at 0, which a tree from before the
    rate runs too); two rates with --baseline are refused, naming the flag."""
    import argparse

    from uni_agent.bench.main import _dispatch, _sweep_args, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    paced = _sweep_args(parser.parse_args(["--baseline", "HEAD~1", "--start-rate", "200", "--concurrency", "8"]))
    assert paced[-2:] == ["--start-rate", "200"]
    assert "--start-rate" not in _sweep_args(parser.parse_args(["--baseline", "HEAD~1", "--start-rate", "0"]))
    with pytest.raises(SystemExit, match="--start-rate with --baseline takes one rate"):
        _dispatch(parser.parse_args(["--baseline", "HEAD~1", "--start-rate", "0,200"]))


def test_the_sweeps_endpoint_processes_follow_the_rollouts_in_flight(monkeypatch):
    """One stand-in endpoint process per 256 rollouts in flight, at most a quarter of the usable CPUs, at least one:
    one process answered a wave of 1,024 calls 42-55 ms late on average (session 25), which counted as the framework's."""
    from uni_agent.bench import measure

    monkeypatch.setattr(measure, "usable_cpus", lambda: 16)
    assert [measure.endpoint_processes_for(n) for n in (4, 256, 257, 1024, 4096)] == [1, 1, 2, 4, 4]
    monkeypatch.setattr(measure, "usable_cpus", lambda: 2)  # `taskset -c 0,1`
    assert measure.endpoint_processes_for(1024) == 1


def test_endpoint_processes_given_to_both_trees_of_a_pair_and_one_value_there():
    """--endpoint-processes reaches both halves of a --baseline pair (one value); several are refused with
    --baseline and with --simulate, naming the flag."""
    import argparse

    from uni_agent.bench.main import _dispatch, _sweep_args, add_arguments, options_from

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert _sweep_args(parser.parse_args(["--baseline", "HEAD~1", "--endpoint-processes", "4"]))[-2:] == [
        "--endpoint-processes", "4"]
    assert "--endpoint-processes" not in _sweep_args(parser.parse_args(["--baseline", "HEAD~1"]))
    assert options_from(parser.parse_args(["--endpoint-processes", "1,4"])).endpoint_processes == [1, 4]
    for extra in (["--baseline", "HEAD~1"], ["--simulate"]):
        with pytest.raises(SystemExit, match="--endpoint-processes takes one value"):
            _dispatch(parser.parse_args([*extra, "--endpoint-processes", "1,2"]))


def test_a_sweep_point_with_two_endpoint_shapes_runs_each_with_its_own_pool(tmp_path, monkeypatch):
    """--endpoint-processes 1,2: the point runs twice, each row with a pool of that many processes, which answered
    that row's calls and no other's."""
    from uni_agent.bench import baseline

    monkeypatch.setattr(baseline, "SETTLE_S", 0.0)  # the quiet between the two rows: not what this test checks
    lines = []
    options = BenchOptions(concurrency=[4], workers=[1], turns=1, delay_s=0.1, waves=1, peer=False,
                           endpoint_processes=[1, 2], out_dir=tmp_path / "bench")
    report = run_bench(options, echo=lines.append)
    rows = report["rows"]
    assert [r["endpoint"]["processes"] for r in rows] == [1, 2], "\n".join(lines)
    assert all(r["ok"] == 4 and r["endpoint"]["requests"] == 4 * 2 for r in rows), "\n".join(lines)
    text = "\n".join(lines)
    assert "endpoint: 1 process, 8 requests" in text and "endpoint: 2 processes, 8 requests" in text


def test_a_pairs_table_says_each_trees_stand_in_endpoint():
    """A --baseline pair whose halves ran different stand-in endpoints says so under the table: an older tree's
    bench had one endpoint for its whole sweep (its report's top level), this one a pool per row."""
    from uni_agent.bench.baseline import sweep_table

    def row(**extra):
        return {"system": "uni-agent", "concurrency": 1024, "workers": 12, "efficiency": 0.9, "ok": 1024, **extra}

    before = {"rows": [row()], "endpoint": {"processes": 1, "late_mean_s": 0.0452}}
    after = {"rows": [row(endpoint={"processes": 4, "late_mean_s": 0.0031})]}
    lines = sweep_table(before, after, "0123456789abcdef")
    assert "  01234567 c1024/12w: endpoint 1 process(es), replies 45.2 ms late on average (the whole sweep's: " \
           "that tree's bench had one for it)" in lines, lines
    assert "  now c1024/12w: endpoint 4 process(es), replies 3.1 ms late on average" in lines, lines
