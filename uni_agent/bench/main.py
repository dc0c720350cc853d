"""`uni-agent bench`: its arguments, the sweep and the side-by-side peer run; `--simulate`, `--baseline`,
`--sandbox-only`, `--client-only` and `--image-starts` hand over to their own modules. The table and the targets next
to the figures are in sweep_report.py."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .baseline import settle
from .cpu_split import breakdown_line, split_line
from .endpoint_pool import EndpointPool
from .lifetime import stop_on_signals
from .measure import (FDS_PER_ROLLOUT_SANDBOX, cpus_line, endpoint_processes_for, ensure_limits, load_average,
                      open_files_line)
from .out_dir import prepare_out_dir
from .sweep_report import comparison_lines, endpoint_line, show_errors, table_head, table_line, target_lines

METHOD = """\
method: every rollout = {calls} LLM calls ({turns} x execute_bash `{command}` in its own bubblewrap sandbox, then submit);
  the endpoint (asyncio HTTP servers in processes of their own, --endpoint-processes) answers each call {delay:g} s
  after it arrived; under each row, how late its replies left.
  rollouts = {waves} x concurrency.
  ideal = max(rollouts x calls x delay / concurrency, calls x delay); eff = ideal / makespan; makespan = wall time of
  the run call (actor start, rollouts, Parquet writes; cluster start excluded). Verification off.
  fw CPU/turn = CPU time of the driver process (scheduler included) and of the worker processes, their own only
  (RUSAGE_SELF), over LLM calls: it excludes the endpoint's process and every child process. sbx CPU/turn = every
  process below a worker over LLM calls, from /proc (the "sandboxes" of the CPU split under each row): the sandbox
  fork servers, the sandboxes, each command's shell and the command, git at start and patch collection, what pid 1
  reaped of them included. lost/dup = rollouts with no row, and keys with more than one, in the run's Parquet part
  files. machine CPU/turn = the whole machine's user+system CPU (/proc/stat) over the run, the endpoint's
  included, over LLM calls: what a turn costs this machine in all (not measured for the peer, whose imports would
  count). MiB/rollout = (peak summed RSS of driver + workers - RSS before the run) / concurrency. mini-swe-agent:
  its own batch runner in one process (threads), LocalEnvironment (plain subprocess, no sandbox, nothing to start),
  fw CPU = that process's own CPU after imports."""


@dataclass
class BenchOptions:
    concurrency: list[int]
    workers: list[int]
    turns: int = 8
    delay_s: float = 2.0
    waves: int = 2
    command: str = "echo hello && ls"
    peer: bool = True
    peer_max_concurrency: int = 64
    out_dir: Path | None = None
    profile_dir: Path | None = None
    json_path: Path | None = None
    keep: bool = False
    start_rates: list[float] = field(default_factory=lambda: [0.0])  # the run's start_rate (0: all at once)
    endpoint_processes: list[int] | None = None  # the stand-in model's processes; None: endpoint_processes_for(point)


def run_bench(options: BenchOptions, echo=print) -> dict[str, Any]:
    """Runs the sweep (and the peer), echoes the table as it fills, returns every figure."""
    from .ours import run_ours, sandbox_start_alone
    from .peer import peer_available, run_peer

    out = options.out_dir or Path(tempfile.mkdtemp(prefix="uni-agent-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("UNI_AGENT_SANDBOX_ROOT", str(out / "sandboxes"))  # inherited by the worker processes
    notes = ensure_limits(max(options.concurrency), min(options.workers))
    notes.append(open_files_line(max(options.concurrency), min(options.workers), 1, FDS_PER_ROLLOUT_SANDBOX))
    peer_missing = peer_available() if options.peer else "--no-peer"
    header = _header(options, peer_missing)
    for line in header + notes:
        echo(line)
    alone = sandbox_start_alone()
    echo(f"sandbox start alone (20 starts one after another, nothing else running): p50 {alone['p50_ms']:.0f} ms, "
         f"p95 {alone['p95_ms']:.0f} ms")
    rows: list[dict[str, Any]] = []
    echo(table_head())
    # The stand-in model is the simulation's asyncio endpoint, a pool of its own per row, so that each row says its
    # own lag: a thread per connection (the bench's endpoint until 2026-12-07) added tens of ms a call at 256 in
    # flight, and one process alone answers a wave of 1,024 calls 8-17 ms late on average, 0.2-0.3 s of a rollout's
    # nine calls, which the rows would put on the framework's side (docs/benchmarks.md, sessions 24 and 27).
    for concurrency in options.concurrency:
        rollouts = options.waves * concurrency
        processes = options.endpoint_processes or [endpoint_processes_for(concurrency)]
        points = [(w, r, p) for w in options.workers for r in options.start_rates for p in processes]
        for workers, rate, endpoint_processes in points:
            if len(options.start_rates) > 1 or len(processes) > 1:  # compared in one invocation: neither inherits
                settle(echo)  # the other's freed inodes (baseline.settle)
            name = (f"ours-w{workers}-c{concurrency}" + (f"-r{rate:g}" if rate else "")
                    + (f"-e{endpoint_processes}" if len(processes) > 1 else ""))
            with EndpointPool(endpoint_processes, options.delay_s, options.turns, options.command) as endpoint:
                row = run_ours(endpoint.base_url, concurrency=concurrency, workers=workers, turns=options.turns,
                               delay_s=options.delay_s, rollouts=rollouts, out_dir=out / name,
                               profile_dir=options.profile_dir, endpoint_pids=endpoint.pids, start_rate=rate)
            row["endpoint"] = endpoint.stats
            rows.append(row)
            echo(table_line(row))
            echo("    " + split_line(row["cpu_split_s"], row["llm_calls"]))
            echo("    " + breakdown_line(row["cpu_else_s"], row["llm_calls"]))
            echo(f"    a rollout's time past the ideal, mean / worst: {row['over_ideal_mean_s']:.2f} / "
                 f"{row['over_ideal_max_s']:.2f} s; of it the model calls' wait past their delay "
                 f"{row['model_late_mean_s']:.2f} / {row['model_late_max_s']:.2f} s, its commands "
                 f"{row['commands_mean_s']:.2f} / {row['commands_max_s']:.2f} s; the sandbox's start past the "
                 f"first call's delay (the most a first command waited for it), p95 "
                 f"{row['start_past_first_call_p95_ms']:.0f} ms")
            echo(f"    open files at peak: busiest worker {row['peak_fds_worker']} "
                 f"({row['peak_fds_worker'] / row['rollouts_per_worker']:.2f} per rollout in flight)")
            echo("    " + endpoint_line(row["endpoint"]))
            show_errors(row, echo)
        if peer_missing is None and concurrency <= options.peer_max_concurrency:
            try:
                with EndpointPool(endpoint_processes_for(concurrency), options.delay_s, options.turns,
                                  options.command) as endpoint:
                    row = run_peer(endpoint.base_url, concurrency=concurrency, turns=options.turns,
                                   delay_s=options.delay_s, rollouts=rollouts, out_dir=out / f"peer-c{concurrency}")
                row["endpoint"] = endpoint.stats
            except Exception as exc:  # the peer failing is a figure of its own, not a reason to lose ours
                row = {"system": "mini-swe-agent", "concurrency": concurrency, "rollouts": rollouts,
                       "failed": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
            rows.append(row)
            echo(table_line(row))
            show_errors(row, echo)
    comparisons = comparison_lines(rows)
    targets = target_lines(rows, alone)
    echo("")
    for line in comparisons + [""] + targets:
        echo(line)
    report = {"options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(options).items()},
              "header": header, "notes": notes, "rows": rows, "comparisons": comparisons, "targets": targets,
              "sandbox_start_alone": alone}
    if options.json_path:
        options.json_path.write_text(json.dumps(report, indent=1, default=str))
    if options.out_dir is None and not options.keep:
        shutil.rmtree(out, ignore_errors=True)
    return report


def _header(options: BenchOptions, peer_missing: str | None) -> list[str]:
    calls = options.turns + 1
    lines = [f"uni-agent bench: {cpus_line()} ({platform.processor() or platform.machine()}), Python "
             f"{platform.python_version()}, load average {load_average():.2f} at start"]
    if load_average() > 0.5 * (os.cpu_count() or 1):
        lines.append("  warning: the machine is busy (load average above half its CPUs): figures may be disturbed")
    lines.append(METHOD.format(calls=calls, turns=options.turns, command=options.command, delay=options.delay_s,
                               waves=options.waves))
    peer = (f"mini-swe-agent 2.4.6 at each concurrency up to {options.peer_max_concurrency}" if peer_missing is None
            else f"not run ({peer_missing})")
    lines.append(f"peer: {peer}")
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    ints = lambda text: [int(x) for x in text.split(",") if x.strip()]  # noqa: E731
    floats = lambda text: [float(x) for x in text.split(",") if x.strip()]  # noqa: E731
    parser.add_argument("--concurrency", type=ints, default=None, help="concurrent rollouts to sweep (default 16,64,256,1024)")
    parser.add_argument("--workers", type=ints, default=None, help="Dask worker processes to sweep (default 1,2)")
    parser.add_argument("--turns", type=int, default=None, help="execute_bash turns per rollout, before submit (default 8)")
    parser.add_argument("--delay-s", type=float, default=None, help="endpoint latency per LLM call (default 2)")
    parser.add_argument("--waves", type=int, default=None, help="rollouts = waves x concurrency (default 2)")
    parser.add_argument("--command", default=None, help="the command each turn runs (default: echo hello && ls)")
    parser.add_argument("--start-rate", type=floats, default=None, metavar="RATES",
                        help="the runs' start_rate, rollouts started per second (0: all at once, the default); "
                        "several, comma-separated, are run one after another at each point (0,300: a pair without "
                        "and with it, in one invocation); with --simulate too")
    parser.add_argument("--endpoint-processes", type=ints, default=None, metavar="N",
                        help="the stand-in model's processes, sharing one port; several, comma-separated, are run one "
                        "after another at each point of the sweep (1,4: the same point with both). Default: one per 256 "
                        "rollouts in flight, at most a quarter of the usable CPUs; with --simulate one value, default 2")
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="also run mini-swe-agent's batch runner on the same workload (needs the bench extra)")
    parser.add_argument("--peer-max-concurrency", type=int, default=64,
                        help="run the peer only up to this concurrency (default 64: its CPU per turn makes a 256/1024 "
                        "run take tens of minutes on 2 cores)")
    parser.add_argument("--quick", action="store_true",
                        help="a small sweep (concurrency 4,16; 1 worker; 2 turns of 0.2 s; 1 wave) to check the setup")
    parser.add_argument("--out", type=Path, help="keep every run's results and logs here, a new or empty folder "
                        "(default: a temp dir, removed)")
    parser.add_argument("--clear-out", action="store_true",
                        help="empty --out first (only what an earlier bench wrote there; it says what it removed)")
    parser.add_argument("--profile", type=Path, help="record py-spy profiles (speedscope) of driver and workers here")
    parser.add_argument("--json", type=Path, help="also write every figure as JSON here")
    parser.add_argument("--baseline", metavar="REF",
                        help="also measure this earlier git commit (a temporary worktree; or a directory holding an "
                        "exported tree), in the same invocation, and "
                        "print before/after tables: the sandbox alone, then the rollout sweep (peer off)")
    parser.add_argument("--sweep-only", action="store_true",
                        help="with --baseline: only the rollout sweep of REF and of this tree (no client or sandbox "
                        "figures)")
    parser.add_argument("--sandbox-only", action="store_true",
                        help="only the sandbox figures (true round trip, machine CPU per command, memory per sandbox)")
    parser.add_argument("--sandbox-image", default=None,
                        help="also measure the podman backend on this local image (e.g. the tests' image)")
    parser.add_argument("--sandbox-commands", type=int, default=500, help="`true` calls per sandbox figure")
    parser.add_argument("--image-starts", metavar="IMAGE",
                        help="only: starts, `true` round trip and disk per sandbox of the local sandbox over IMAGE's "
                        "root filesystem next to podman running IMAGE (bench/image_start.py)")
    parser.add_argument("--rootless-user", metavar="USER",
                        help="with --image-starts, run as root: also measure the local sandbox as this ordinary user "
                        "(its user namespace overlay, and a copy per start as before it)")
    parser.add_argument("--client-only", action="store_true",
                        help="only the LLM client's CPU per request (2,000 requests, 100 in flight, a scripted endpoint)")
    parser.add_argument("--record-only", action="store_true",
                        help="only the driver's CPU per recorded rollout (20,000 rows: deserialized, written to Parquet, "
                        "the page's fields and the log line; bench/record_cost.py)")
    sim = parser.add_argument_group("--simulate: the control plane at scale (uni_agent/bench/simulate.py)")
    sim.add_argument("--simulate", action="store_true",
                     help="real dask scheduler/worker/driver processes, events, page and Parquet; the sandbox is an "
                     "in-memory stand-in (commands take --command-s, canned output) and the model an endpoint pool")
    parser.add_argument("--gateway", action="store_true",
                        help="only the harness model gateway's overhead per call: latency p50/p95 and worker CPU, next "
                        "to a direct call (uni_agent/bench/gateway.py)")
    parser.add_argument("--gateway-calls", type=int, default=300, help="calls per path for --gateway (300)")
    parser.add_argument("--gateway-sweep", action="store_true",
                        help="our loop next to mini-swe-agent as a harness, at each --concurrency (default 4,16): "
                        "rollouts/min and CPU per turn (--turns 4, --delay-s 0.5; needs its prepared venv)")
    sim.add_argument("--in-flight", type=ints, default=None, help="rollouts in flight to sweep (default 1000)")
    sim.add_argument("--command-s", type=float, default=0.05, help="seconds each stand-in command takes (0.05)")
    sim.add_argument("--faults", action="store_true",
                     help="then, at the largest point: kill 2 workers and the driver once, resume, count rows")
    sim.add_argument("--faults-only", action="store_true", help="only the --faults run (no sweep before it)")


def options_from(args: argparse.Namespace) -> BenchOptions:
    quick = dict(concurrency=[4, 16], workers=[1], turns=2, delay_s=0.2, waves=1)
    full = dict(concurrency=[16, 64, 256, 1024], workers=[1, 2], turns=8, delay_s=2.0, waves=2)
    base = quick if args.quick else full
    pick = lambda name: getattr(args, name) if getattr(args, name) is not None else base[name]  # noqa: E731
    return BenchOptions(concurrency=pick("concurrency"), workers=pick("workers"), turns=pick("turns"),
                        delay_s=pick("delay_s"), waves=pick("waves"),
                        command=args.command or BenchOptions.command, peer=args.peer,
                        peer_max_concurrency=args.peer_max_concurrency, out_dir=args.out,
                        profile_dir=args.profile, json_path=args.json, start_rates=args.start_rate or [0.0],
                        endpoint_processes=args.endpoint_processes)


def cmd_bench(args: argparse.Namespace) -> int:
    """The bench's entry: its processes end with it (lifetime.py), and it starts only on an empty --out."""
    from ..driver.interrupt import RunInterrupted

    stop_on_signals()
    for line in prepare_out_dir(args.out, args.clear_out):
        print(line, flush=True)
    try:
        return _dispatch(args)
    except RunInterrupted as stopped:  # a signal during a run call: the run stopped, then the bench unwound
        print(f"uni-agent bench: {stopped}", file=sys.stderr, flush=True)
        return stopped.exit_status


def _dispatch(args: argparse.Namespace) -> int:
    started = time.monotonic()
    if len(args.endpoint_processes or []) > 1 and (args.baseline or args.simulate):
        raise SystemExit("uni-agent bench: --endpoint-processes takes one value with --baseline or --simulate; "
                         "compare several in one invocation of the sweep instead (--endpoint-processes 1,4)")
    if args.baseline and len(args.start_rate or []) > 1:
        raise SystemExit("uni-agent bench: --start-rate with --baseline takes one rate: a pair must differ in one thing "
                         "(the tree); compare rates in one invocation of one tree instead (--start-rate 0,R)")
    if args.image_starts:
        from .image_start import compare

        for line in compare(args.image_starts, rootless_user=args.rootless_user):
            print(line, flush=True)
        return 0
    if args.simulate:
        return simulate(args)
    if args.gateway:
        from .gateway import run_gateway_bench

        run_gateway_bench(args.gateway_calls, args.json, echo=lambda line: print(line, flush=True))
        return 0
    if args.gateway_sweep:
        from .gateway import run_harness_sweep

        rows = run_harness_sweep(args.concurrency or [4, 16], turns=args.turns or 4,
                                 delay_s=args.delay_s if args.delay_s is not None else 0.5,
                                 echo=lambda line: print(line, flush=True))
        return 0 if all(r["ok"] == r["rollouts"] for r in rows) else 1
    if args.baseline or args.sandbox_only or args.client_only or args.record_only:
        return compare_with_baseline(args)
    report = run_bench(options_from(args), echo=lambda line: print(line, flush=True))
    print(f"bench took {time.monotonic() - started:.0f} s", file=sys.stderr)
    failed = [r for r in report["rows"] if r["system"] == "uni-agent" and r["ok"] != r["rollouts"]]
    return 1 if failed else 0


def simulate(args: argparse.Namespace) -> int:
    from .simulate import SimOptions, ok, run_simulation

    options = SimOptions(in_flight=args.in_flight or [1000], workers=(args.workers or [2])[0],
                         delay_s=args.delay_s if args.delay_s is not None else 20.0,
                         turns=args.turns if args.turns is not None else 4, command_s=args.command_s,
                         waves=args.waves or 1, endpoint_processes=(args.endpoint_processes or [2])[0],
                         faults=args.faults,
                         faults_only=args.faults_only,
                         out_dir=args.out, profile_dir=args.profile, json_path=args.json,
                         start_rates=args.start_rate or [0.0])
    started = time.monotonic()
    echo = lambda line: print(line, flush=True)  # noqa: E731
    before = None
    if args.baseline:  # the same sweep with uni_agent imported from REF in every process but this one's
        from . import baseline
        from .simulate_report import before_after

        echo(f"before: {args.baseline}")
        with baseline.worktree(args.baseline) as tree:
            path = baseline.tree_env(tree)["PYTHONPATH"]
            old = dataclasses.replace(options, extra_env={"PYTHONPATH": path}, cwd=tree,
                                      out_dir=options.out_dir / "before" if options.out_dir else None, faults=False,
                                      faults_only=False, port_fill=baseline.port_fill(tree))
            before = run_simulation(old, echo=echo)
        echo("now:")
    report = run_simulation(options, echo=echo)
    if before is not None:
        for line in before_after(before, report, args.baseline):
            echo(line)
    print(f"bench took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0 if ok(report) else 1


def _compare_record_cost(trees: list[tuple[str, Path | None]], echo) -> None:  # noqa: ANN001
    from . import baseline

    echo(f"uni-agent bench, the driver's CPU per recorded rollout: {cpus_line()}, load average {load_average():.2f}; "
         "20,000 finished rollouts (5 turns each) as agent workers reply, 500 a reply; CPU of the measuring process; "
         "the trees take turns, twice each")
    for round_ in (1, 2):
        for label, tree in trees:
            figures = baseline.record_figures(tree, 20000)
            parts = ", ".join(f"{k} {v:.1f}" for k, v in figures["parts_us_per_row"].items())
            echo(f"  {label:>22} (run {round_}): {figures['us_per_row']:.1f} us per row ({parts}); handing a "
                 f"rollout out {figures['handout_us_per_spec']:.1f} us")


def compare_with_baseline(args: argparse.Namespace) -> int:
    """The sandbox figures (and, unless --sandbox-only, the rollout sweep) of REF and of this tree, side by side."""
    from . import baseline

    echo = lambda line: print(line, flush=True)  # noqa: E731
    started = time.monotonic()
    backends = [("local", None)] + ([("podman", args.sandbox_image)] if args.sandbox_image else [])
    trees: list[tuple[str, Path | None]] = [("now", baseline.THIS_TREE)]
    with contextlib.ExitStack() as stack:
        if args.baseline:
            label = f"before ({Path(args.baseline).name[:10]})"
            trees.insert(0, (label, stack.enter_context(baseline.worktree(args.baseline))))
        if args.sweep_only and args.baseline:
            return _compare_sweeps(args, trees[0][1], echo, started)
        if args.record_only:
            _compare_record_cost(trees, echo)
            return 0
        echo(f"uni-agent bench, LLM client alone: {cpus_line()}, load average {load_average():.2f}; 2,000 "
             "chat requests (a mid-rollout turn with tool schemas), 100 in flight, to a scripted endpoint in its own "
             "process; CPU of the client's process; the trees take turns, twice each (one run alone swings ~15%)")
        for round_ in (1, 2):
            for label, tree in trees:
                figures = baseline.client_figures(tree, 2000, 100)
                echo(f"  {label:>22} (run {round_}): {figures['client_cpu_ms_per_request']:.2f} ms CPU per request "
                     f"(wall {figures['wall_s']:.1f} s)")
        if args.client_only:
            return 0
        echo(f"uni-agent bench, sandbox alone: {cpus_line()}, load average {load_average():.2f} at start; "
             f"{args.sandbox_commands} `true` calls in one live sandbox; memory = MemAvailable drop over 32 live "
             "sandboxes / 32; machine CPU = /proc/stat over the calls / calls; close after write = 8 sandboxes "
             "that wrote 64 MiB each, closed at once, until the last close returned; wave = 256 sandboxes started, "
             "given `echo hello && ls` and closed at once, the bench process's own CPU (its threads) per sandbox")
        rows = []
        for backend, image in backends:
            for label, tree in trees:
                if len(trees) > 1:
                    baseline.settle(echo)  # the wave makes and removes thousands of dirs: neither tree inherits them
                rows.append((label, baseline.sandbox_figures(tree, backend, image, args.sandbox_commands, 32)))
        for line in baseline.sandbox_table(rows):
            echo(line)
        if not args.sandbox_only and args.baseline:
            bench_args = _sweep_args(args)
            echo(f"\nrollout sweep ({' '.join(bench_args)}), {args.baseline} then now:")
            baseline.settle(echo)
            before = baseline.sweep_figures(trees[0][1], bench_args)
            baseline.settle(echo)
            after = baseline.sweep_figures(baseline.THIS_TREE, bench_args)
            for line in baseline.sweep_table(before, after, args.baseline):
                echo(line)
    print(f"bench took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def _compare_sweeps(args: argparse.Namespace, before_tree: Path | None, echo, started: float) -> int:  # noqa: ANN001
    """`--baseline REF --sweep-only`: the rollout sweep of REF, then of this tree; the before/after table."""
    from . import baseline

    bench_args = _sweep_args(args)
    echo(f"rollout sweep ({' '.join(bench_args)}), {cpus_line()}, "
         f"load average {load_average():.2f}; {args.baseline} then now:")
    baseline.settle(echo)
    before = baseline.sweep_figures(before_tree, bench_args)
    baseline.settle(echo)
    after = baseline.sweep_figures(baseline.THIS_TREE, bench_args)
    label = Path(args.baseline).name if Path(args.baseline).is_dir() else args.baseline
    for line in baseline.sweep_table(before, after, label):
        echo(line)
    if args.json:
        args.json.write_text(json.dumps({"before": before, "after": after}, indent=1, default=str))
    print(f"bench took {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


def _sweep_args(args: argparse.Namespace) -> list[str]:
    options = options_from(args)
    return ["--concurrency", ",".join(map(str, options.concurrency)), "--workers", ",".join(map(str, options.workers)),
            "--turns", str(options.turns), "--delay-s", f"{options.delay_s:g}", "--waves", str(options.waves),
            "--command", options.command, *_rate_args(args),
            # both trees get it where it was given (a tree before session 27 reads it only with --simulate)
            *(["--endpoint-processes", str(options.endpoint_processes[0])] if options.endpoint_processes else [])]


def _rate_args(args: argparse.Namespace) -> list[str]:
    """One --start-rate for both trees of a pair; none at 0, where a tree from before the rate (fc036fd) runs too."""
    rate = (args.start_rate or [0.0])[0]
    return ["--start-rate", f"{rate:g}"] if rate else []
