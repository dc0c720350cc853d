"""The workload on uni-agent: a real LocalCluster, real AgentWorker actors, real bubblewrap sandboxes.

Every rollout is the same small bundled task (uni-agent__romanum-4, one row with n = rollouts); the endpoint scripts
`turns` execute_bash calls of a cheap command, then submit. Verification is off (it is a separate Dask future after
the episode, not the per-turn path); results are written to Parquet as in any run, and the patch is collected.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from .cpu_split import CpuSplit
from .lifetime import die_with_bench, stop_on_signals
from .measure import (Cpu, PeakMemory, cpu_now, ideal_makespan, load_average, machine_cpu_seconds, percentile,
                      record_counts)
from .out_dir import refuse_earlier_results

TASK = "uni-agent__romanum-4"


def bench_rows(out_dir: Path) -> list[dict[str, Any]]:
    from ..driver.dataset import read_rows
    from ..tasks.swe_form import convert

    path = out_dir / "bundled.parquet"
    if not path.exists():
        convert(None, path)
    return [r for r in read_rows(path) if r["instance_id"] == TASK]


def bench_agents(concurrency: int, turns: int):
    from ..config import AgentConfigs
    from ..settings import REPO_ROOT

    agents = AgentConfigs.load(REPO_ROOT / "examples" / "agent_interaction" / "agent_config_local.yaml")
    return agents.override_all({
        "concurrency": concurrency,
        "interaction": {"tools_in": "api", "constrain_tool_calls": False, "tool_call_parser": "hermes",
                        "max_turns": turns + 1, "episode_timeout": 3600, "action_timeout": 60},
    })


def run_ours(base_url: str, *, concurrency: int, workers: int, turns: int, delay_s: float, rollouts: int,
             out_dir: Path, profile_dir: Path | None = None, endpoint_pids: list[int] | None = None,
             start_rate: float = 0.0) -> dict[str, Any]:
    import threading

    import dask
    from distributed import Client, LocalCluster

    from ..driver.cluster import local_cluster_config, local_cluster_options
    from ..driver.run import run
    from ..sandbox.local import prepare_base_repo, resolve_repo

    refuse_earlier_results(out_dir)  # a run on them would resume: nothing to do, a makespan of 0.1 s
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = bench_rows(out_dir.parent)
    prepare_base_repo(resolve_repo(f"bundled:{TASK}"))  # the shared snapshot is built once per task, not measured
    # A run's cluster (TLS, guarded pages, private scratch), with its dashboard on: what a run pays for it, the bench
    # pays too; on a port of its own, beside a run's 8787.
    with dask.config.set(local_cluster_config()), \
            LocalCluster(**local_cluster_options(workers, 2, "127.0.0.1:0"), silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        worker_pids = list(client.run(os.getpid).values())
        pids = [os.getpid(), *worker_pids]
        # The LocalCluster's scheduler (and its nannies) run on its IO-loop thread in this process.
        scheduler_tids = [t.native_id for t in threading.enumerate() if t.name == "IO loop" and t.native_id]
        before_workers = client.run(cpu_now)
        before_driver = cpu_now()
        load_before = load_average()
        machine_before = machine_cpu_seconds()
        log = io.StringIO()
        with _profiles(pids, profile_dir, f"ours-w{workers}-c{concurrency}"), PeakMemory(pids) as memory, \
                PeakMemory(worker_pids) as worker_files, \
                CpuSplit(os.getpid(), scheduler_tids, worker_pids, endpoint_pids or []) as split, \
                contextlib.redirect_stderr(log):
            started, wall_started = time.monotonic(), time.time()
            outcome = run(rows, bench_agents(concurrency, turns), client=client, engine="external",
                          base_url=base_url, model_name="scripted", n=rollouts, agent_workers=workers, verify=False,
                          progress=False, output_dir=str(out_dir), log_level="INFO", start_rate=start_rate)
            makespan, wall_returned = time.monotonic() - started, time.time()
        stop_on_signals()  # the run's own handlers left the default behind
        machine_cpu = machine_cpu_seconds() - machine_before
        after_workers = client.run(cpu_now)
        after_driver = cpu_now()
    workers_cpu = sum((after_workers[a] - before_workers[a] for a in after_workers), Cpu())
    driver_cpu = after_driver - before_driver
    results = outcome.results
    llm_calls = int(results["num_turns"].sum())
    commands = int(results["num_turns"].clip(upper=turns).sum())
    ok = int((results["exit_reason"] == "submitted").sum())
    starts = [float(x) for x in results["sandbox_start_s"] if x > 0]
    ideal = ideal_makespan(rollouts, concurrency, turns + 1, delay_s)
    failures = results[results["exit_reason"] != "submitted"]
    return {
        "system": "uni-agent", "workers": workers, "concurrency": concurrency, "rollouts": rollouts, "ok": ok,
        "start_rate": start_rate,
        **record_counts(out_dir / "results", rollouts),  # recorded, lost, duplicates: from the part files
        "makespan_s": makespan, "ideal_s": ideal, "efficiency": ideal / makespan,
        "rollouts_per_min": rollouts / makespan * 60,
        # The run's fixed cost: from the call to the first rollout's start, and from the last one's end to the return.
        "lead_in_s": float(results["started_at"].min()) - wall_started,
        "tail_s": wall_returned - float(results["finished_at"].max()),
        "llm_calls": llm_calls, "commands": commands,
        "framework_cpu_s": workers_cpu.own + driver_cpu.own,
        "framework_cpu_ms_per_turn": (workers_cpu.own + driver_cpu.own) / max(1, llm_calls) * 1000,
        "worker_cpu_ms_per_turn": workers_cpu.own / max(1, llm_calls) * 1000,
        "driver_cpu_ms_per_turn": driver_cpu.own / max(1, llm_calls) * 1000,
        # Every process below a worker (the fork server, its sandboxes, their commands, git), from /proc: a worker's own
        # RUSAGE_CHILDREN no longer sees them, since the fork server that reaps them outlives the run (cpu_split.py).
        "sandbox_cpu_ms_per_turn": split.seconds["sandboxes"] / max(1, llm_calls) * 1000,
        "machine_cpu_ms_per_turn": machine_cpu / max(1, llm_calls) * 1000,
        "cpu_split_s": split.seconds,
        "cpu_else_s": split.breakdown(),
        "sandbox_start_p50_ms": percentile(starts, 0.5) * 1000, "sandbox_start_p95_ms": percentile(starts, 0.95) * 1000,
        # A start runs while the first model call waits (agent_loop._first_turn), whose reply comes no sooner than
        # delay_s: past that, and only past it, the first command waits for its sandbox. An upper bound of that wait.
        "start_past_first_call_p95_ms": percentile([max(0.0, s - delay_s) for s in starts], 0.95) * 1000,
        **time_split(results, (turns + 1) * delay_s),
        "peak_mib_per_rollout": memory.added / 2**20 / concurrency,
        "peak_fds_worker": worker_files.peak_fds, "rollouts_per_worker": -(-concurrency // workers),
        "load": max(load_before, load_average()),
        "errors": sorted({str(e)[:200] for e in failures["error"].dropna()})[:3],
        "log_tail": log.getvalue()[-2000:] if len(failures) else "",
    }


def time_split(results: Any, model_ideal_s: float) -> dict[str, float]:
    """Where a rollout's time went, from its row: the model calls' wait past the endpoint's own delay (what the
    framework adds around a call: the event loop, the connection, the endpoint's queue), its commands (the burst of a
    turn's commands in the sandboxes), and its wall time past the ideal; mean and worst over the rollouts."""
    late = results["llm_s"] - model_ideal_s
    over = results["total_s"] - model_ideal_s
    return {"model_late_mean_s": float(late.mean()), "model_late_max_s": float(late.max()),
            "commands_mean_s": float(results["tools_s"].mean()), "commands_max_s": float(results["tools_s"].max()),
            "over_ideal_mean_s": float(over.mean()), "over_ideal_max_s": float(over.max())}


@contextlib.contextmanager
def _profiles(pids: list[int], profile_dir: Path | None, name: str):
    """py-spy on each process while the run lasts (speedscope files; open them at https://www.speedscope.app)."""
    if profile_dir is None:
        yield
        return
    profile_dir.mkdir(parents=True, exist_ok=True)
    procs = [start_profiler(pid, profile_dir / f"{name}-pid{pid}.json", 100, "speedscope") for pid in pids]
    try:
        yield
    finally:
        stop_profilers(procs)


def start_profiler(pid: int, output: Path, rate: int, fmt: str) -> subprocess.Popen:
    """`py-spy record` of one process into `output` (`fmt`: speedscope, raw, flamegraph)."""
    return subprocess.Popen([_py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
                             "--format", fmt, "--output", str(output)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=die_with_bench())


def stop_profilers(procs: list[subprocess.Popen]) -> None:
    """SIGINT makes py-spy write its file; one that does not end within a minute is killed."""
    for proc in procs:
        proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _py_spy() -> str:
    import shutil
    import sys

    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise RuntimeError("--profile needs py-spy (pip install -e '.[bench]')")
    return found


def sandbox_start_alone(samples: int = 20) -> dict[str, float]:
    """Sandbox start with nothing else running in this process: `samples` starts one after another (each closed
    before the next), as a rollout's start costs when the machine is not saturated. The table's start column is
    the same start inside the run, where it queues for CPU behind every other rollout."""
    import asyncio

    from ..sandbox.local import LocalDeploymentConfig, LocalSandbox
    from ..episode.worker import use_pidfd_child_watcher

    async def measure() -> list[float]:
        use_pidfd_child_watcher()
        seconds = []
        for i in range(samples + 1):
            sandbox = LocalSandbox(LocalDeploymentConfig(repo=f"bundled:{TASK}"), {}, name="bench-start")
            started = time.monotonic()
            try:
                await sandbox.start()
                if i:  # the first one builds caches
                    seconds.append(time.monotonic() - started)
            finally:
                await sandbox.close()
        return seconds

    seconds = asyncio.run(measure())
    return {"p50_ms": percentile(seconds, 0.5) * 1000, "p95_ms": percentile(seconds, 0.95) * 1000}
