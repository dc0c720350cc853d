"""The figures of `uni-agent bench --simulate` as text: the table (one line per point), how each figure grows with
the rollouts, the per-point check, and the before/after lines of a `--baseline` run."""

from __future__ import annotations

import math
from typing import Any

COLUMNS = [("in flight", 9), ("start/s", 7), ("ok/total", 13), ("makespan s", 10), ("ideal s", 7), ("eff", 5),
           ("rollouts/min", 12),
           ("sched cores", 11), ("sched MiB", 9), ("driver cores", 12), ("driver MiB", 10), ("worker cores", 12),
           ("worker MiB", 10), ("events/s", 8), ("page KB", 7), ("page ms", 7), ("pq KB/s", 7), ("parts", 5), ("load", 5)]


def table_line(row: dict[str, Any]) -> str:
    workers = [k for k in row["worker_cores"]]
    rss = row["peak_rss_mib"]
    driver_mib = max([rss.get("driver", 0.0), rss.get("driver-resumed", 0.0)])
    values = [row["in_flight"], f"{row['start_rate']:g}" if row.get("start_rate") else "-",
              f"{row['recorded'] - row['duplicates']}/{row['rollouts']}", f"{row['makespan_s']:.1f}",
              f"{row['ideal_s']:.1f}", f"{row['efficiency']:.2f}", f"{row['rollouts_per_min']:.0f}",
              f"{row['scheduler_cores']:.2f}", f"{rss.get('scheduler', 0):.0f}", f"{row['driver_cores']:.2f}",
              f"{driver_mib:.0f}", "/".join(f"{row['worker_cores'][w]:.2f}" for w in workers),
              "/".join(f"{rss.get(w, 0):.0f}" for w in workers), f"{row['events_per_s']:.0f}",
              f"{row['page_state_kb_max']:.0f}", f"{row['page_build_ms_max']:.1f}",
              f"{row['parquet_bytes_per_s'] / 1000:.1f}", row["part_files"], f"{row.get('load', float('nan')):.1f}"]
    return " | ".join(str(v).rjust(width) for v, (_, width) in zip(values, COLUMNS, strict=True))


def table_head() -> str:
    head = " | ".join(name.rjust(width) for name, width in COLUMNS)
    return f"{head}\n{'-' * len(head)}"


def _workers_cpu_s(row: dict[str, Any]) -> float:
    return sum(row["cpu_s"][w] for w in row["worker_cores"])


GROWTH = [("scheduler CPU s", lambda r: r["cpu_s"].get("scheduler", 0.0)),
          ("driver CPU s", lambda r: r["cpu_s"].get("driver", 0.0) + r["cpu_s"].get("driver-resumed", 0.0)),
          ("workers CPU s", _workers_cpu_s),
          ("scheduler peak MiB", lambda r: r["peak_rss_mib"].get("scheduler", 0.0)),
          ("driver peak MiB", lambda r: r["peak_rss_mib"].get("driver", 0.0)),
          ("workers peak MiB", lambda r: sum(r["peak_rss_mib"].get(w, 0.0) for w in r["worker_cores"])),
          ("events", lambda r: r["events"]),
          ("page state KB", lambda r: r["page_state_kb_max"]),
          ("page build ms", lambda r: r["page_build_ms_max"]),
          ("Parquet bytes", lambda r: r["parquet_bytes"])]


def growth_lines(rows: list[dict[str, Any]]) -> list[str]:
    """How each figure grows with the rollouts: the exponent k in figure ~ rollouts^k between the smallest and the
    largest point (1 = linear; above 1 grows faster than linearly), and the figure per rollout at each point."""
    rows = [r for r in rows if not r["faults"]]
    rows = [r for r in rows if r.get("start_rate") == rows[0].get("start_rate")] if rows else rows  # one rate's points
    if len(rows) < 2:
        return []
    small, large = rows[0], rows[-1]
    scale = large["rollouts"] / small["rollouts"]
    lines = [f"growth from {small['rollouts']} to {large['rollouts']} rollouts (x{scale:g}); k in figure ~ n^k:"]
    for name, get in GROWTH:
        a, b = get(small), get(large)
        k = math.log(b / a) / math.log(scale) if a > 0 and b > 0 and scale > 1 else float("nan")
        per = ", ".join(f"{get(r) / r['rollouts']:.4g}" for r in rows)
        lines.append(f"  {name:>18}: k = {k:5.2f}   per rollout: {per}")
    return lines


def before_after(before: dict[str, Any], after: dict[str, Any], ref: str) -> list[str]:
    """One line per in-flight point measured both times (faults runs left out)."""
    lines = [f"before ({ref}) -> now, same invocation, same machine:"]
    old = {r["in_flight"]: r for r in before["rows"] if not r["faults"]}
    for row in (r for r in after["rows"] if not r["faults"] and r["in_flight"] in old):
        b = old[row["in_flight"]]
        lines.append(
            f"  {row['in_flight']} in flight: eff {b['efficiency']:.2f} -> {row['efficiency']:.2f}, rollouts/min "
            f"{b['rollouts_per_min']:.0f} -> {row['rollouts_per_min']:.0f}, makespan {b['makespan_s']:.0f} -> "
            f"{row['makespan_s']:.0f} s, driver CPU {b['cpu_s'].get('driver', 0):.1f} -> "
            f"{row['cpu_s'].get('driver', 0):.1f} s, scheduler CPU {b['cpu_s'].get('scheduler', 0):.1f} -> "
            f"{row['cpu_s'].get('scheduler', 0):.1f} s, workers CPU {_workers_cpu_s(b):.1f} -> "
            f"{_workers_cpu_s(row):.1f} s, "
            f"record tail {b.get('record_tail_s', math.nan):.1f} -> "
            f"{row.get('record_tail_s', math.nan):.1f} s")
    return lines


def check_line(row: dict[str, Any]) -> str:
    """What the point's results say: rows lost or twice, the driver's exit, what the page held."""
    return (f"    recorded {row['recorded']} rows for {row['rollouts']} rollouts: {row['lost']} lost, "
            f"{row['duplicates']} duplicate keys, {row['submitted']} submitted; driver exit {row['driver_exit']}; "
            f"page held {row['page_rollouts_held']} rollouts, largest state {row['page_state_kb_max']:.0f} KB built "
            f"in {row['page_build_ms_max']:.1f} ms (HTTP {row['page_http_ms_max']:.0f} ms)" + timeline(row)
            + open_files(row))


def open_files(row: dict[str, Any]) -> str:
    """The open files each kind of process held at its peak (sampled each second), per rollout it served."""
    fds = row.get("peak_fds") or {}
    if not fds:
        return ""
    workers = [fds[k] for k in fds if k.startswith("sim-")]
    endpoints = [fds[k] for k in fds if k.startswith("endpoint-")]
    per_worker = -(-row["in_flight"] // max(1, len(workers)))
    per_endpoint = -(-row["in_flight"] // max(1, len(endpoints)))
    busiest = lambda values, per: f"{max(values)} ({max(values) / per:.2f} per rollout in flight)" if values else "-"  # noqa: E731
    return (f"\n    open files at peak: busiest worker {busiest(workers, per_worker)}, busiest endpoint process "
            f"{busiest(endpoints, per_endpoint)}, scheduler {fds.get('scheduler', 0)}, driver {fds.get('driver', 0)}")


def timeline(row: dict[str, Any]) -> str:
    if "record_tail_s" not in row:
        return ""
    return (f"\n    after the driver's start: first rollout started at {row.get('first_started_s', math.nan):.1f} s, "
            f"last at {row['last_started_s']:.1f} s, last finished on "
            f"its worker at {row['last_finished_s']:.1f} s, last row on disk at {row['last_recorded_s']:.1f} s "
            f"(record tail {row['record_tail_s']:.1f} s)" + phases_line(row))


def phases_line(row: dict[str, Any]) -> str:
    """The driver's own steps (its log's `run_phase` events), in seconds after its process started; a tree from
    before those events prints none."""
    phases = row.get("driver_phases") or []
    if not phases:
        return ""
    return "\n    driver's steps: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases)

