"""Before/after of a run's first wave against its engine's start, in one invocation on one machine:

    python -m uni_agent.bench.engine_overlap --baseline REF --pairs 2 --output-dir /tmp/overlap -- \
        --max-samples 8 --n 1 --max-turns 2 --max-tokens 64 --temperature 0 --no-verify

runs examples/agent_interaction/parallel_infer.py (the quickstart's run: a real llama-server, real sandboxes) from
REF's tree (a git worktree) and from this tree, alternating, `--pairs` times each, and prints per run, from its
driver log and its Parquet rows:

- engine ready: the driver's `engines_ready` step, seconds after `connected` (the cluster up);
- first wave: the rollouts whose episode began within a second of the first one; their sandbox wait p50/p95 (the
  rows' sandbox_start_s: how long an episode, once begun, waited for its sandbox) and when the last of them had its
  sandbox (seconds after `connected`);
- the run's wall time (summary.json) and the machine's load average before it.

A run's first wave starts its sandboxes while the engine starts (uni_agent.driver.session, rollouts_before_engines):
its episodes then begin with their sandboxes started. A tree without that starts them only once the engine is ready
and has read the shared prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from .baseline import THIS_TREE, tree_env, worktree
from .lifetime import die_with_bench

PARALLEL_INFER = Path("examples") / "agent_interaction" / "parallel_infer.py"
FIRST_WAVE_S = 1.0  # episodes begun within this of the first one: the first wave


def driver_phases(log_dir: Path) -> dict[str, float]:
    """The driver's steps (run_phase events) as Unix times, the first of each name."""
    phases: dict[str, float] = {}
    for path in log_dir.glob("driver-*.jsonl"):
        for line in path.read_text().splitlines():
            if '"run_phase"' in line:
                event = json.loads(line)
                at = datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()
                phases.setdefault(event["phase"], at)
    return phases


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(out: Path) -> dict[str, Any]:
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "results", columns=["started_at", "sandbox_start_s"]).to_pylist()
    phases = driver_phases(out / "logs")
    t0 = phases["connected"]
    first = min(r["started_at"] for r in rows)
    wave = [r for r in rows if r["started_at"] - first <= FIRST_WAVE_S]
    waits = [r["sandbox_start_s"] for r in wave]
    return {"engine_ready_s": phases["engines_ready"] - t0, "first_episode_s": first - t0, "wave": len(wave),
            "wave_wait_p50_ms": 1000 * statistics.median(waits), "wave_wait_p95_ms": 1000 * percentile(waits, 0.95),
            "wave_sandboxes_by_s": max(r["started_at"] + r["sandbox_start_s"] for r in wave) - t0,
            "wall_s": json.loads((out / "summary.json").read_text())["wall_seconds"], "rollouts": len(rows)}


def one_run(tree: Path, out: Path, run_args: list[str]) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    load = os.getloadavg()[0]
    done = subprocess.run([sys.executable, str(tree / PARALLEL_INFER), *run_args, "--no-progress", "--output-dir",
                           str(out)], cwd=tree, env=tree_env(tree), capture_output=True, text=True,
                          preexec_fn=die_with_bench())
    if done.returncode != 0:
        raise RuntimeError(f"{out}: parallel_infer.py exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {**measure(out), "load": load}


def line(label: str, m: dict[str, Any]) -> str:
    return (f"  {label:<7} load {m['load']:4.1f}: engine ready {m['engine_ready_s']:5.1f} s, first episode "
            f"{m['first_episode_s']:5.1f} s, first wave {m['wave']} rollouts: sandbox wait p50/p95 "
            f"{m['wave_wait_p50_ms']:6.0f}/{m['wave_wait_p95_ms']:6.0f} ms, all its sandboxes by "
            f"{m['wave_sandboxes_by_s']:5.1f} s; run wall {m['wall_s']:6.1f} s ({m['rollouts']} rollouts)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, metavar="REF", help="the earlier commit (or a tree's directory)")
    parser.add_argument("--pairs", type=int, default=1, help="before/after runs, alternating (default 1)")
    parser.add_argument("--output-dir", required=True, type=Path, help="each run goes to OUTPUT_DIR/before-K, after-K")
    parser.add_argument("run_args", nargs="*", help="parallel_infer.py arguments (after --)")
    args = parser.parse_args(argv)
    print(f"engine_overlap: {os.cpu_count()} CPUs, {len(os.sched_getaffinity(0))} usable, parallel_infer.py "
          f"{' '.join(args.run_args)}; seconds after the driver's `connected` step", flush=True)
    results: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with worktree(args.baseline) as base:
        for k in range(args.pairs):
            for label, tree in (("before", base), ("after", THIS_TREE)):
                m = one_run(tree, args.output_dir / f"{label}-{k}", args.run_args)
                results[label].append(m)
                print(line(label, m), flush=True)
    for key, name in (("wave_wait_p95_ms", "first wave's sandbox wait p95 ms"),
                      ("wave_sandboxes_by_s", "first wave's sandboxes all started by s"), ("wall_s", "run wall s")):
        print(f"{name}: {' / '.join(f'{m[key]:.1f}' for m in results['before'])} -> "
              f"{' / '.join(f'{m[key]:.1f}' for m in results['after'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
