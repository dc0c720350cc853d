"""`uni-agent bench --baseline REF`: the same measurements on an earlier commit, in the same invocation.

Every speed claim is a before/after pair measured in one run on the same machine. The earlier commit is checked out
in a temporary git worktree and measured in subprocesses whose `import uni_agent` resolves to that worktree
(PYTHONPATH and working directory); then this tree is measured the same way. The sandbox figures come from
sandbox_rtt.py (which uses only the public sandbox API, so it runs against old trees), the rollout sweep from the
worktree's own `uni-agent bench --json`.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .lifetime import die_with_bench

THIS_TREE = Path(__file__).resolve().parent.parent.parent
SANDBOX_RTT = Path(__file__).resolve().with_name("sandbox_rtt.py")
CLIENT_CPU = Path(__file__).resolve().with_name("client_cpu.py")
RECORD_COST = Path(__file__).resolve().with_name("record_cost.py")


class BaselineError(RuntimeError):
    """The baseline could not be checked out or measured; the message says which step and why."""


@contextlib.contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """A detached git worktree of `ref`, removed afterwards; a directory holding an exported tree is used as it is
    (for a machine the checkout reaches without its .git, e.g. `git archive REF | tar -x -C DIR`)."""
    if Path(ref).is_dir():
        yield Path(ref).resolve()
        return
    if not (THIS_TREE / ".git").exists():
        raise BaselineError(f"--baseline needs a git checkout of uni-agent; {THIS_TREE} is not one")
    path = Path(tempfile.mkdtemp(prefix="uni-agent-baseline-"))
    added = subprocess.run(["git", "-C", str(THIS_TREE), "worktree", "add", "--detach", "-f", str(path), ref],
                           capture_output=True, text=True)
    if added.returncode != 0:
        raise BaselineError(f"git worktree add {ref} failed: {added.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(THIS_TREE), "worktree", "remove", "--force", str(path)],
                       capture_output=True)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a subprocess whose `import uni_agent` resolves to `tree` (run it with cwd=tree too)."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def port_fill(tree: Path) -> float:
    """The share of the ephemeral ports one endpoint address took in `tree`'s simulation (bench/measure.py's
    PORT_FILL), so that `--simulate --baseline` lays the endpoint out as that tree's bench did; 1.0 for a tree from
    before it spread the endpoint over addresses (one address for up to the whole range)."""
    code = "from uni_agent.bench.measure import PORT_FILL; print(PORT_FILL)"
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env=tree_env(tree), text=True, capture_output=True,
                          timeout=120)
    return float(done.stdout) if done.returncode == 0 else 1.0


def sandbox_figures(tree: Path, backend: str, image: str | None, commands: int, sandboxes: int) -> dict[str, Any]:
    """sandbox_rtt.py's figures with `uni_agent` imported from `tree`."""
    argv = [sys.executable, str(SANDBOX_RTT), "--backend", backend, "--commands", str(commands),
            "--sandboxes", str(sandboxes)] + (["--image", image] if image else [])
    done = subprocess.run(argv, cwd=tree, env=tree_env(tree), capture_output=True, text=True, timeout=1800,
                          preexec_fn=die_with_bench())
    if done.returncode != 0:
        raise BaselineError(f"the sandbox bench failed in {tree} ({backend}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def client_figures(tree: Path, requests: int, in_flight: int) -> dict[str, Any]:
    """client_cpu.py's figures with `uni_agent` imported from `tree`."""
    argv = [sys.executable, str(CLIENT_CPU), "--requests", str(requests), "--in-flight", str(in_flight)]
    done = subprocess.run(argv, cwd=tree, env=tree_env(tree), capture_output=True, text=True, timeout=1800,
                          preexec_fn=die_with_bench())
    if done.returncode != 0:
        raise BaselineError(f"the LLM client bench failed in {tree}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def record_figures(tree: Path, rows: int) -> dict[str, Any]:
    """record_cost.py's figures with `uni_agent` imported from `tree`."""
    done = subprocess.run([sys.executable, str(RECORD_COST), "--rows", str(rows)], cwd=tree, env=tree_env(tree),
                          capture_output=True, text=True, timeout=1800, preexec_fn=die_with_bench())
    if done.returncode != 0:
        raise BaselineError(f"the record cost bench failed in {tree}: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# Before each half of a rollout pair: the disk synced, then this long with nothing running. On ext4 without a
# journal (this project's test machines), the inode allocator skips every inode freed in the last 30 s (5.5 min
# while its table block is unwritten), and each sandbox makes and removes several: a half run right after the other
# walked past those and was the slower one (docs/benchmarks.md, session 21).
SETTLE_S = 35.0


def settle(say: Callable[[str], None]) -> None:
    say(f"  (sync, then {SETTLE_S:g} s of quiet before the next half: neither half inherits the other's freed inodes "
        "or dirty pages)")
    os.sync()
    time.sleep(SETTLE_S)


def sweep_figures(tree: Path, bench_args: list[str]) -> dict[str, Any]:
    """The rollout sweep of `tree`'s own bench (no peer), as its --json report."""
    report = Path(tempfile.mkstemp(prefix="uni-agent-bench-", suffix=".json")[1])
    argv = [sys.executable, "-m", "uni_agent.cli", "bench", *bench_args, "--no-peer", "--json", str(report)]
    try:
        done = subprocess.run(argv, cwd=tree, env=tree_env(tree), text=True, timeout=7200,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=die_with_bench())
        if not report.exists() or not report.read_text().strip():
            raise BaselineError(f"the rollout bench failed in {tree}: {done.stdout[-3000:]}")
        return json.loads(report.read_text())
    finally:
        report.unlink(missing_ok=True)


SANDBOX_COLUMNS = [("tree", 22, "{}"), ("backend", 7, "{}"), ("true p50 ms", 11, "{:.2f}"),
                   ("true p95 ms", 11, "{:.2f}"), ("machine CPU ms/cmd", 18, "{:.2f}"), ("own CPU ms/cmd", 14, "{}"),
                   ("MiB/live sandbox", 16, "{}"), ("start p50 ms", 12, "{}"), ("own CPU ms/start", 16, "{}"),
                   ("close after write ms", 20, "{}"), ("wave: own CPU ms/sandbox", 24, "{}")]


def sandbox_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    head = " | ".join(name.rjust(width) for name, width, _ in SANDBOX_COLUMNS)
    lines = [head, "-" * len(head)]
    for label, f in rows:
        values = [label, f["backend"], f["rtt_p50_ms"], f["rtt_p95_ms"], f["machine_cpu_ms_per_command"],
                  _figure(f.get("own_cpu_ms_per_command"), "{:.2f}"), _figure(f["memory_mib_per_sandbox"], "{:.1f}"),
                  _figure(f.get("start_p50_ms"), "{:.1f}"), _figure(f.get("own_cpu_ms_per_start"), "{:.1f}"),
                  _figure(f.get("close_after_write_ms"), "{:.0f}"),
                  _figure(f.get("wave_process_cpu_ms_per_sandbox"), "{:.2f}")]
        lines.append(" | ".join(fmt.format(v).rjust(width) for (_, width, fmt), v in zip(SANDBOX_COLUMNS, values)))
    return lines


def _figure(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


SWEEP_FIELDS = [("efficiency", "{:.2f}"), ("rollouts_per_min", "{:.0f}"), ("framework_cpu_ms_per_turn", "{:.2f}"),
                ("machine_cpu_ms_per_turn", "{:.2f}"), ("sandbox_start_p50_ms", "{:.0f}"),
                ("sandbox_start_p95_ms", "{:.0f}"), ("lead_in_s", "{:.2f}"), ("tail_s", "{:.2f}"), ("ok", "{}")]


def sweep_table(before: dict[str, Any], after: dict[str, Any], ref: str) -> list[str]:
    """Our rows of both reports side by side, matched on (concurrency, workers)."""
    from .sweep_report import lost_dup, milliseconds
    ours = lambda report: {(r["concurrency"], r["workers"]): r for r in report["rows"]  # noqa: E731
                           if r.get("system") == "uni-agent"}
    old, new = ours(before), ours(after)
    labels = {"efficiency": "eff", "rollouts_per_min": "rollouts/min", "framework_cpu_ms_per_turn": "fw CPU ms/turn",
              "machine_cpu_ms_per_turn": "machine CPU ms/turn", "sandbox_start_p50_ms": "start p50 ms",
              "sandbox_start_p95_ms": "start p95 ms", "lead_in_s": "lead-in s", "tail_s": "tail s",
              "ok": "ok (lost/dup)"}
    head = f"{'conc':>5} | {'workers':>7} | " + " | ".join(
        f"{labels[name]} {which}".rjust(24) for name, _ in SWEEP_FIELDS for which in (f"({ref[:8]})", "(now)"))
    lines = [head, "-" * len(head)]
    for key in sorted(set(old) | set(new)):
        cells = []
        for name, fmt in SWEEP_FIELDS:
            for report in (old, new):
                value = report.get(key, {}).get(name)
                text = "-" if value is None else fmt.format(value)
                if name == "ok" and key in report:  # an older tree's bench has no lost/dup: "-/-"
                    text += f" ({lost_dup(report[key])})"
                cells.append(text.rjust(24))
        lines.append(f"{key[0]:>5} | {key[1]:>7} | " + " | ".join(cells))
    from .cpu_split import breakdown_line, split_line

    for label, report in ((ref[:8], old), ("now", new)):
        for key, row in sorted(report.items()):
            if row.get("cpu_split_s"):  # a tree whose bench splits the machine's CPU by process
                lines.append(f"  {label} c{key[0]}/{key[1]}w: " + split_line(row["cpu_split_s"], row["llm_calls"]))
                lines.append(f"  {label} c{key[0]}/{key[1]}w: " + breakdown_line(row["cpu_else_s"], row["llm_calls"]))
    # The stand-in model of each half: a tree's bench before 2026-12-07 (session 27) ran one process for the whole
    # sweep, this one a pool per row, so a pair can differ in it; its replies' lateness counts against the framework.
    for label, report, rows in ((ref[:8], before, old), ("now", after, new)):
        for key, row in sorted(rows.items()):
            stands_in = row.get("endpoint") or report.get("endpoint") or {}
            whole = "" if "endpoint" in row else " (the whole sweep's: that tree's bench had one for it)"
            lines.append(f"  {label} c{key[0]}/{key[1]}w: endpoint {stands_in.get('processes', 1)} process(es), "
                         f"replies {milliseconds(stands_in.get('late_mean_s'))} ms late on average{whole}")
    return lines
