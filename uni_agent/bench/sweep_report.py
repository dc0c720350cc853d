"""The figures of the `uni-agent bench` sweep as text: the table (one line per run), the side-by-side lines against
the peer, and the targets next to the figures."""

from __future__ import annotations

import math
from typing import Any

from .measure import cpus_line

TARGET_EFFICIENCY, TARGET_EFFICIENCY_AT = 0.95, 256  # issue 40 (issue 27 asked 0.9)
TARGET_CPU_MS_PER_TURN = 2.0
TARGET_START_P50_MS = 100.0  # a start alone
TARGET_START_P95_IN_WAVE_MS = 100.0  # issue 40: inside a wave, every rollout of which starts at once
TARGET_FULL_COMPLETION_AT = 1024
TARGET_PEER_RATIO = 2.0  # rollouts/min against mini-swe-agent's at TARGET_EFFICIENCY_AT (issue 27)


COLUMNS = [("system", 14, "{}"), ("workers", 7, "{}"), ("start/s", 7, "{}"), ("conc", 5, "{}"), ("ok/total", 10, "{}"),
           ("lost/dup", 8, "{}"),
           ("makespan s", 10, "{:.1f}"), ("ideal s", 7, "{:.1f}"), ("eff", 5, "{:.2f}"), ("rollouts/min", 12, "{:.0f}"),
           ("fw CPU ms/turn", 14, "{:.2f}"), ("sbx CPU ms/turn", 15, "{:.2f}"), ("machine CPU ms/turn", 19, "{}"),
           ("start p50/p95 ms", 16, "{}"), ("lead-in/tail s", 14, "{}"),
           ("MiB/rollout", 11, "{:.2f}"), ("load", 5, "{:.1f}")]


def table_head() -> str:
    head = " | ".join(name.rjust(width) for name, width, _ in COLUMNS)
    return f"{head}\n{'-' * len(head)}"


def table_line(row: dict[str, Any]) -> str:
    if "failed" in row:
        return (f"{row['system']:>14} | {'':>7} | {'':>7} | {row['concurrency']:>5} | "
                f"FAILED: {row['failed'].splitlines()[-1][:150]}")
    values = {
        "system": row["system"], "workers": row["workers"], "conc": row["concurrency"],
        "start/s": f"{row['start_rate']:g}" if row.get("start_rate") else "-",
        "ok/total": f"{row['ok']}/{row['rollouts']}", "lost/dup": lost_dup(row), "makespan s": row["makespan_s"], "ideal s": row["ideal_s"],
        "eff": row["efficiency"], "rollouts/min": row["rollouts_per_min"],
        "fw CPU ms/turn": row["framework_cpu_ms_per_turn"], "sbx CPU ms/turn": row["sandbox_cpu_ms_per_turn"],
        "machine CPU ms/turn": f"{row['machine_cpu_ms_per_turn']:.2f}" if "machine_cpu_ms_per_turn" in row else "n/a",
        "start p50/p95 ms": "n/a (none)" if math.isnan(row["sandbox_start_p50_ms"])
        else f"{row['sandbox_start_p50_ms']:.0f}/{row['sandbox_start_p95_ms']:.0f}",
        "lead-in/tail s": f"{row['lead_in_s']:.2f}/{row['tail_s']:.2f}" if "lead_in_s" in row else "n/a",
        "MiB/rollout": row["peak_mib_per_rollout"], "load": row["load"],
    }
    return " | ".join(fmt.format(values[name]).rjust(width) for name, width, fmt in COLUMNS)


def lost_dup(row: dict[str, Any]) -> str:
    """'0/0': rollouts with no row / keys recorded twice ('-' where a system cannot record a key twice)."""
    lost, dup = row.get("lost"), row.get("duplicates")
    return f"{'-' if lost is None else lost}/{'-' if dup is None else dup}"


def milliseconds(seconds: float | None) -> str:
    """Seconds as ms with one decimal; '?' where a figure is missing."""
    return "?" if seconds is None else f"{1000 * seconds:.1f}"


def endpoint_line(stats: dict[str, Any]) -> str:
    """What the stand-in model did for one row: its processes, requests and CPU, and how late its replies left."""
    processes = stats.get("processes", 1)
    return (f"endpoint: {processes} process{'es' if processes != 1 else ''}, {stats.get('requests')} requests, "
            f"{stats.get('cpu_s', 0):.1f} s CPU (not counted above); its replies left "
            f"{milliseconds(stats.get('late_mean_s'))} ms after their delay on average, "
            f"{milliseconds(stats.get('late_max_s'))} at worst (of the model calls' wait past their delay, the "
            "endpoint's own part)")


def show_errors(row: dict[str, Any], echo) -> None:
    for error in row.get("errors") or []:
        echo(f"    error in {row['system']} c={row['concurrency']}: {error}")


def _ok(row: dict[str, Any]) -> bool:
    return "failed" not in row


def comparison_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for peer in [r for r in rows if r["system"] == "mini-swe-agent" and _ok(r)]:
        ours = [r for r in rows if r["system"] == "uni-agent" and r["concurrency"] == peer["concurrency"]]
        if not ours:
            continue
        best = max(ours, key=lambda r: r["rollouts_per_min"])
        lines.append(
            f"side by side at concurrency {peer['concurrency']}: uni-agent ({best['workers']} worker(s)) "
            f"{best['rollouts_per_min']:.0f} rollouts/min vs mini-swe-agent {peer['rollouts_per_min']:.0f}: ratio "
            f"{best['rollouts_per_min'] / peer['rollouts_per_min']:.2f}x; fw CPU/turn {best['framework_cpu_ms_per_turn']:.2f}"
            f" vs {peer['framework_cpu_ms_per_turn']:.2f} ms (ratio {peer['framework_cpu_ms_per_turn'] / best['framework_cpu_ms_per_turn']:.2f}x less);"
            f" MiB/rollout {best['peak_mib_per_rollout']:.2f} vs {peer['peak_mib_per_rollout']:.2f}")
    for peer in [r for r in rows if r["system"] == "mini-swe-agent" and not _ok(r)]:
        lines.append(f"mini-swe-agent at concurrency {peer['concurrency']} failed: {peer['failed'][-300:]}")
    return lines


def target_lines(rows: list[dict[str, Any]], alone: dict[str, float]) -> list[str]:
    ours = [r for r in rows if r["system"] == "uni-agent"]
    lines = ["targets (uni-agent):"]

    def mark(ok: bool) -> str:
        return "MET    " if ok else "NOT MET"

    at = [r for r in ours if r["concurrency"] == TARGET_EFFICIENCY_AT]
    if at:
        best = max(at, key=lambda r: r["efficiency"])
        lines.append(f"  [{mark(best['efficiency'] >= TARGET_EFFICIENCY)}] >= {TARGET_EFFICIENCY} of ideal throughput at "
                     f"{TARGET_EFFICIENCY_AT} concurrent: {best['efficiency']:.2f} ({best['workers']} worker(s); "
                     + ", ".join(f"{r['workers']}w {r['efficiency']:.2f}" for r in at) + f") on {cpus_line()}")
    else:
        lines.append(f"  [not run] >= {TARGET_EFFICIENCY} of ideal at {TARGET_EFFICIENCY_AT}: add it to --concurrency")
    if ours:
        worst = max(ours, key=lambda r: r["framework_cpu_ms_per_turn"])
        lines.append(f"  [{mark(worst['framework_cpu_ms_per_turn'] < TARGET_CPU_MS_PER_TURN)}] framework CPU < "
                     f"{TARGET_CPU_MS_PER_TURN:g} ms/turn: " + ", ".join(
                         f"c{r['concurrency']}/{r['workers']}w {r['framework_cpu_ms_per_turn']:.2f}" for r in ours))
    lines.append(f"  [{mark(alone['p50_ms'] < TARGET_START_P50_MS)}] local sandbox start p50 < {TARGET_START_P50_MS:g} ms, "
                 f"alone: {alone['p50_ms']:.0f} ms (p95 {alone['p95_ms']:.0f})")
    if ours:
        # The start overlaps the first model call, so the second figure is what a rollout's first command waited.
        worst = max(ours, key=lambda r: r["sandbox_start_p95_ms"])
        lines.append(f"  [{mark(worst['sandbox_start_p95_ms'] <= TARGET_START_P95_IN_WAVE_MS)}] local sandbox start p95 "
                     f"<= {TARGET_START_P95_IN_WAVE_MS:g} ms inside the runs (all rollouts of a wave start at once; "
                     "in brackets the p95 of the start past the first model call's delay): " + ", ".join(
                         f"c{r['concurrency']}/{r['workers']}w {r['sandbox_start_p95_ms']:.0f} "
                         f"({r['start_past_first_call_p95_ms']:.0f})" for r in ours))
    big = [r for r in ours if r["concurrency"] == TARGET_FULL_COMPLETION_AT]
    if big:
        ok = all(r["ok"] == r["rollouts"] for r in big)
        lines.append(f"  [{mark(ok)}] {TARGET_FULL_COMPLETION_AT} concurrent rollouts complete without failures: "
                     + ", ".join(f"{r['workers']}w {r['ok']}/{r['rollouts']}" for r in big))
    else:
        lines.append(f"  [not run] {TARGET_FULL_COMPLETION_AT} concurrent rollouts: add it to --concurrency")
    peer = [r for r in rows if r["system"] == "mini-swe-agent" and _ok(r) and r["concurrency"] == TARGET_EFFICIENCY_AT]
    if peer and at:
        ratio = max(r["rollouts_per_min"] for r in at) / peer[0]["rollouts_per_min"]
        lines.append(f"  [{mark(ratio >= TARGET_PEER_RATIO)}] >= {TARGET_PEER_RATIO:g}x mini-swe-agent's rollouts/min at "
                     f"{TARGET_EFFICIENCY_AT} concurrent: {ratio:.2f}x")
    else:
        lines.append(f"  [not run] >= {TARGET_PEER_RATIO:g}x mini-swe-agent's rollouts/min at {TARGET_EFFICIENCY_AT}: "
                     f"add --peer-max-concurrency {TARGET_EFFICIENCY_AT}")
    return lines

