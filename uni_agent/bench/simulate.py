"""`uni-agent bench --simulate`: the control plane at thousands of rollouts in flight, the data plane stood in for.

Real: a `dask scheduler` process (with the uni-agent page, preloaded), `dask worker` processes, the driver (`uni-agent
run` as its own process, connected by scheduler file), AgentWorker actors, the agent loop, the LLM client, events,
the page's state, Parquet, resume. Stood in for: the sandbox (deployment type `memory`: each command takes
`command_s` and prints canned output, nothing runs) and the model (EndpointPool: processes answering after `delay_s`).
Each point runs `waves x in_flight` rollouts with the agent's concurrency at `in_flight`.

Per point it reports efficiency against the ideal makespan, rollouts/min, CPU and peak memory of the scheduler, the
driver and each worker (psutil, sampled each second), events/s into the scheduler, the size and build time of the
page's state (built in the scheduler, as its HTTP handler builds it), Parquet bytes/s and part files, and checks
the results: every rollout recorded once. `--faults` kills 2 workers and then the driver during the first point and
resumes the driver with the same output dir.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .baseline import settle
from .endpoint_pool import EndpointPool
from .lifetime import die_with_bench
from .measure import (
    FDS_PER_ROLLOUT_SIMULATED,
    PORT_FILL,
    connections_per_address,
    cpus_line,
    endpoint_addresses,
    ensure_limits,
    load_average,
    open_files_line,
    record_counts,
)
from .out_dir import refuse_earlier_results
from .simulate_processes import ProcessCluster, Sampler, page_probe, stop_session
from .simulate_report import check_line, growth_lines, table_head, table_line

COMMAND = "echo hello && ls"
N_PER_TASK = 4  # rollouts per task: in_flight x waves rollouts = tasks x 4


@dataclass
class SimOptions:
    in_flight: list[int]
    workers: int = 2
    delay_s: float = 20.0
    turns: int = 4
    command_s: float = 0.05
    waves: int = 1
    endpoint_processes: int = 2
    faults: bool = False
    faults_only: bool = False  # the faults run alone, without the sweep before it
    out_dir: Path | None = None
    profile_dir: Path | None = None
    json_path: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)  # for the scheduler, workers and driver
    cwd: Path | None = None  # theirs (`--baseline`: the earlier tree, so that `python -m` imports it first)
    # the share of the ephemeral ports one endpoint address takes (measure.PORT_FILL): `--baseline` lays the endpoint
    # out as the earlier tree's bench did (baseline.port_fill)
    port_fill: float = PORT_FILL
    start_rates: list[float] = field(default_factory=lambda: [0.0])  # the driver's --start-rate at each point


def ideal_makespan(options: SimOptions) -> float:
    """One rollout: `turns + 1` model calls and `turns + 1` commands (each turn's, and the patch); rollouts run
    `in_flight` at a time, so `waves` rollouts one after another."""
    return options.waves * ((options.turns + 1) * options.delay_s + (options.turns + 1) * options.command_s)


# -- one point (its processes: simulate_processes.py; its table: simulate_report.py) -------------------------------


def write_inputs(out: Path, options: SimOptions, in_flight: int) -> tuple[Path, Path, int]:
    """The rows (tasks x N_PER_TASK rollouts) and the agent config with the memory deployment."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import yaml

    rollouts = in_flight * options.waves
    tasks = math.ceil(rollouts / N_PER_TASK)
    rows = [{"data_source": "simulate", "instance_id": f"sim-{i:06d}", "agent_name": "sim",
             "prompt": json.dumps([{"role": "user", "content": f"Task {i}: run the command, then submit."}]),
             "extra_info": json.dumps({"instance_id": f"sim-{i:06d}", "tools_kwargs": {}})} for i in range(tasks)]
    data = out / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    agent = [{
        # No _target_ (each tree's own default loop: its module moved) and no tool-call parser (hermes, the default,
        # had another key before beafcb5): --baseline runs older trees, which refuse keys they do not know.
        "name": "sim", "concurrency": in_flight,
        "interaction": {"tools_in": "api", "constrain_tool_calls": False,
                        "max_turns": options.turns + 1, "episode_timeout": 3600, "action_timeout": 60},
        "env": {"deployment": {"type": "memory", "command_s": options.command_s, "startup_timeout": 60}},
        "tools": [{"name": "execute_bash"}, {"name": "submit"}],
        # a grader the rows pass validation with; verification is off (it is not the control plane's per-turn path)
        "reward": {"name": "swe_local", "metadata": {"test_patch": "", "FAIL_TO_PASS": [], "PASS_TO_PASS": []}},
    }]
    config = out / "agents.yaml"
    config.write_text(yaml.safe_dump(agent, sort_keys=False))
    return data, config, tasks * N_PER_TASK


def _driver(cluster: ProcessCluster, data: Path, config: Path, endpoint: str, out: Path, workers: int,
            log_name: str, start_rate: float = 0.0) -> subprocess.Popen:
    log = open(out / log_name, "w")  # noqa: SIM115 - closed with the process
    argv = [str(Path(sys.executable).parent / "uni-agent"), "run", "--data-path", str(data), "--agent-config-path",
            str(config), "--scheduler-file", str(cluster.scheduler_file), "--engine", "external", "--base-url",
            endpoint, "--model", "scripted", "--n", str(N_PER_TASK), "--num-workers", str(workers), "--no-verify",
            "--no-progress", "--output-dir", str(out / "run")]
    if start_rate:  # only when asked: an earlier tree's driver (--baseline) has no such flag
        argv += ["--start-rate", f"{start_rate:g}"]
    if not Path(argv[0]).exists():
        argv[:1] = [sys.executable, "-c", "from uni_agent.cli import main; raise SystemExit(main())"]
    # the cluster's environment: its credentials (a TLS scheduler, joined as the SLURM job scripts' drivers do), its
    # private Dask temporary directory
    return subprocess.Popen(argv, env=cluster.env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True,
                            cwd=cluster.cwd, preexec_fn=die_with_bench())


def run_point(options: SimOptions, in_flight: int, out: Path, echo=print, faults: bool = False,
              start_rate: float = 0.0) -> dict[str, Any]:
    import pyarrow.parquet as pq

    refuse_earlier_results(out / "run")  # a driver on them would resume, with nothing to do
    out.mkdir(parents=True, exist_ok=True)
    data, config, rollouts = write_inputs(out, options, in_flight)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **options.extra_env}
    row: dict[str, Any] = {"in_flight": in_flight, "rollouts": rollouts, "workers": options.workers,
                           "start_rate": start_rate}
    addresses = endpoint_addresses(in_flight, options.port_fill)
    row["endpoint_addresses"] = addresses
    with EndpointPool(options.endpoint_processes, options.delay_s, options.turns, COMMAND, addresses) as endpoint, \
            ProcessCluster(options.workers, out / "cluster", env, options.cwd) as cluster, \
            Sampler(cluster.client, cluster.dashboard) as sampler, \
            _profiles(cluster, options.profile_dir, f"c{in_flight}") as profile:
        sampler.watch("scheduler", cluster.procs["scheduler"].pid)
        for name, pid in cluster.worker_pids.items():
            sampler.watch(name, pid)
        for i, pid in enumerate(endpoint.pids):
            sampler.watch(f"endpoint-{i}", pid)
        events0 = cluster.client.run_on_scheduler(page_probe)["events"]
        load_before = load_average()
        started, started_wall = time.monotonic(), time.time()
        driver = _driver(cluster, data, config, endpoint.base_url, out, options.workers, "driver.log", start_rate)
        try:
            sampler.watch("driver", driver.pid)
            profile(driver.pid, "driver")
            fault_log: list[str] = []
            if faults:
                driver = _inject_faults(cluster, driver, options, data, config, endpoint.base_url, out, sampler,
                                        fault_log, echo)
            code = driver.wait()
        finally:  # stopped early (a signal, an error): the driver first, then the cluster and the endpoints
            if driver.poll() is None:
                driver.terminate()
                stop_session(driver, 10)
        wall = time.monotonic() - started
        last = sampler.probe()
        row["load"] = max(load_before, load_average())  # the machine's 1-minute load: others' work disturbs figures
    row["driver_exit"] = code
    row["faults"] = fault_log
    row["wall_s"] = wall  # from starting the driver process to its exit (imports, connecting, actor start included)
    # The run itself, as the driver times it (rows read → last result written); a run with faults: the whole wall.
    summary = out / "run" / "summary.json"
    makespan = json.loads(summary.read_text())["wall_seconds"] if summary.exists() and not faults else wall
    row["makespan_s"] = makespan
    row["ideal_s"] = ideal_makespan(options)
    row["efficiency"] = row["ideal_s"] / makespan
    row["rollouts_per_min"] = rollouts / makespan * 60
    makespan = wall  # CPU, events and bytes per second: over the whole time the processes worked
    row["endpoint"] = endpoint.stats
    cpu = sampler.cpu
    row["cpu_s"] = dict(cpu)
    row["peak_rss_mib"] = {k: v / 2**20 for k, v in sampler.peak_rss.items()}
    row["peak_fds"] = dict(sampler.peak_fds)
    row["scheduler_cores"] = cpu.get("scheduler", 0.0) / makespan
    row["driver_cores"] = cpu.get("driver", 0.0) / makespan
    workers = [k for k in cpu if k.startswith("sim-")]
    row["worker_cores"] = {k: cpu[k] / makespan for k in workers}
    row["events"] = last["events"] - events0
    row["events_per_s"] = row["events"] / makespan
    page = sampler.page + [last]
    busiest = max(page, key=lambda p: p["build_ms"])
    row["page_state_kb_max"] = max(p["state_bytes"] for p in page) / 1000
    row["page_build_ms_max"] = busiest["build_ms"]
    row["page_http_ms_max"] = max(p.get("http_ms", 0.0) for p in page)
    row["page_rollouts_held"] = last.get("rollouts_held", 0)
    results = out / "run" / "results"
    parts = sorted(results.glob("part-*.parquet"))
    row["part_files"] = len(parts)
    row["parquet_bytes"] = sum(p.stat().st_size for p in parts)
    row["parquet_bytes_per_s"] = row["parquet_bytes"] / makespan
    table = pq.read_table(results, columns=["instance_id", "rollout", "exit_reason", "started_at", "finished_at"]) \
        if parts else None
    row.update(record_timeline(table, parts, started_wall))
    row.update(record_counts(results, rollouts))
    row["driver_phases"] = driver_phases(out / "run" / "logs", started_wall)
    row["submitted"] = table["exit_reason"].to_pylist().count("submitted") if table is not None else 0
    return row


def record_timeline(table: Any, parts: list[Path], t0: float) -> dict[str, float]:
    """When, in seconds after the driver process started, the last rollout started and finished on its worker
    (the rows' started_at / finished_at) and the last row reached disk (the newest part file's mtime); the record
    tail is the time from the last finish to the last row on disk: what the driver adds after the work is done."""
    if table is None or not parts or table.num_rows == 0:
        return {}
    started = table["started_at"].to_pylist()
    first_started, last_started = min(started) - t0, max(started) - t0
    last_finished = max(table["finished_at"].to_pylist()) - t0
    last_recorded = max(p.stat().st_mtime for p in parts) - t0
    return {"first_started_s": first_started, "last_started_s": last_started, "last_finished_s": last_finished, "last_recorded_s": last_recorded,
            "record_tail_s": last_recorded - last_finished}


def driver_phases(log_dir: Path, t0: float) -> list[tuple[str, float]]:
    """The driver's `run_phase` events (uni_agent.driver.progress.run_phase) from its JSON-lines logs, as (phase,
    seconds after `t0`), in order."""
    from datetime import datetime

    phases = []
    for path in sorted(log_dir.glob("driver-*.jsonl")):
        with path.open() as lines:
            for line in lines:
                if '"run_phase"' not in line:
                    continue
                event = json.loads(line)
                at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                phases.append((event["phase"], at - t0))
    return sorted(phases, key=lambda phase: phase[1])


def _inject_faults(cluster: ProcessCluster, driver: subprocess.Popen, options: SimOptions, data: Path, config: Path,
                   endpoint: str, out: Path, sampler: Sampler, fault_log: list[str],
                   echo) -> subprocess.Popen:  # noqa: ANN001
    """Two workers lost at 30% of the ideal makespan; the driver killed once a quarter of the rollouts are on disk
    (so that the resumed driver has rows to skip and rollouts to redo), and started again on the same output dir."""
    ideal = ideal_makespan(options)
    rollouts = options.waves * max(options.in_flight)
    time.sleep(0.3 * ideal)
    for name in sorted(cluster.worker_pids)[:2]:
        cluster.kill_worker(name)
        fault_log.append(f"killed worker {name} at {time.monotonic():.0f}")
    echo(f"    fault: killed 2 of {options.workers} workers at {0.3 * ideal:.0f} s ({', '.join(sorted(cluster.worker_pids)[:2])})")
    while (recorded := _rows_on_disk(out)) < rollouts // 4 and driver.poll() is None:
        time.sleep(1)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    echo(f"    fault: killed the driver ({recorded} of {rollouts} rollouts on disk); starting it again on the same "
         "output dir")
    fault_log.append(f"killed the driver with {recorded} rows on disk")
    resumed = _driver(cluster, data, config, endpoint, out, options.workers, "driver-resumed.log")
    sampler.watch("driver-resumed", resumed.pid)
    return resumed


def _rows_on_disk(out: Path) -> int:
    import pyarrow.parquet as pq

    parts = list((out / "run" / "results").glob("part-*.parquet"))
    return sum(pq.read_metadata(p).num_rows for p in parts)


@contextlib.contextmanager
def _profiles(cluster: ProcessCluster, profile_dir: Path | None, name: str):
    """py-spy on the scheduler and every worker from the start, and on the driver once it is started (yields
    `add(pid, label)`); collapsed stacks (`--format raw`), one file per process."""
    procs: list[subprocess.Popen] = []

    def add(pid: int, label: str) -> None:
        if profile_dir is None:
            return
        from .ours import start_profiler

        profile_dir.mkdir(parents=True, exist_ok=True)
        procs.append(start_profiler(pid, profile_dir / f"{name}-{label}.txt", 50, "raw"))

    add(cluster.procs["scheduler"].pid, "scheduler")
    for worker, pid in cluster.worker_pids.items():
        add(pid, worker)
    try:
        yield add
    finally:
        from .ours import stop_profilers

        stop_profilers(procs)


# -- the sweep -------------------------------------------------------------------------------------------------------


def run_simulation(options: SimOptions, echo=print) -> dict[str, Any]:
    out = (options.out_dir or Path(tempfile.mkdtemp(prefix="uni-agent-sim-"))).resolve()
    out.mkdir(parents=True, exist_ok=True)
    # Per process: a worker holds a connection per rollout it runs, an endpoint process one per rollout it serves.
    notes = ensure_limits(max(options.in_flight), options.workers, options.endpoint_processes, FDS_PER_ROLLOUT_SIMULATED)
    notes.append(open_files_line(max(options.in_flight), options.workers, options.endpoint_processes,
                                 FDS_PER_ROLLOUT_SIMULATED))
    echo(f"uni-agent bench --simulate: {cpus_line()}, Python {sys.version.split()[0]}, load average "
         f"{load_average():.2f} at start")
    echo(f"method: rollouts = {options.waves} x in-flight, each {options.turns} x execute_bash (the memory stand-in: "
         f"{options.command_s * 1000:g} ms, canned output) then submit, every model call answered after "
         f"{options.delay_s:g} s by {options.endpoint_processes} endpoint processes; real dask scheduler + "
         f"{options.workers} dask worker processes, driver = `uni-agent run` process, verification off. ideal = "
         "waves x (calls x delay + commands x command time); CPU = process user+system over the makespan (cores); "
         "MiB = peak RSS; events/s = uni-agent events folded by the scheduler / makespan; page = state.json built "
         "in the scheduler (max over probes every 5 s); pq = Parquet bytes written / makespan")
    most = max(options.in_flight)
    fill = options.port_fill
    notes.append(f"endpoint addresses: {endpoint_addresses(most, fill)} at {most:,} in flight (127.0.0.1, .2, ..., "
                 f"given to the run as replicas): one address takes at most {connections_per_address(fill):,} "
                 f"connections from this host ({fill:.0%} of the kernel's ephemeral ports, "
                 "net.ipv4.ip_local_port_range, which every process shares; past half of them each connect() searches "
                 "every odd port first: python -m uni_agent.bench.connect_cost)")
    for note in notes:
        echo(note)
    echo(table_head())
    rows = []
    points = [(f, r) for f in options.in_flight for r in options.start_rates]
    for in_flight, rate in [] if options.faults_only else points:
        if len(options.start_rates) > 1:  # rates compared in one invocation: settled before each (baseline.settle)
            settle(echo)
        row = run_point(options, in_flight, out / (f"c{in_flight}" + (f"-r{rate:g}" if rate else "")), echo,
                        start_rate=rate)
        rows.append(row)
        echo(table_line(row))
        echo(check_line(row))
    if options.faults or options.faults_only:
        in_flight = options.in_flight[-1]
        echo(f"faults at {in_flight} in flight: kill 2 of {options.workers} workers, then the driver (resume)")
        row = run_point(options, in_flight, out / f"c{in_flight}-faults", echo, faults=True)
        rows.append(row)
        echo(table_line(row))
        echo(check_line(row))
    for line in growth_lines(rows):
        echo(line)
    endpoint_late = max((r["endpoint"].get("late_max_s", 0.0) for r in rows), default=0.0)
    echo(f"endpoint: latest reply {endpoint_late * 1000:.0f} ms after its delay (an endpoint that keeps up: near 0)")
    report = {"options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()}, "rows": rows}
    if options.json_path:
        options.json_path.write_text(json.dumps(report, indent=1, default=str))
    if options.out_dir is None:
        shutil.rmtree(out, ignore_errors=True)
    return report


def ok(report: dict[str, Any]) -> bool:
    return all(r["lost"] == 0 and r["duplicates"] == 0 and r["driver_exit"] == 0 for r in report["rows"])
