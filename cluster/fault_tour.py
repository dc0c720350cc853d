"""The README's five-minute tour with its engine killed once mid-run, and what the kill cost.

    .venv/bin/python cluster/fault_tour.py [--after 4] [--baseline] [--out outputs/fault-tour]

Runs the tour command (parallel_infer.py, agent_config_local.yaml, --n 2 --max-samples 2 --num-workers 2
--max-turns 3 --max-tokens 256) as a driver process of its own, kills its llama-server with -9 once the server has
answered `--after` model calls, and prints: rollouts finished and infra failures, the run's exit status, how long the
engine was down (the crash to the restarted server answering, from the driver's `engine_restarted` event), and the
run's wall time. With --baseline it first runs the same tour without a kill, in the same invocation, and prints both
wall times side by side (on a shared machine the difference is noise as much as cost; the down time is the cost).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

from uni_agent.testing.llama_watch import answered, engine_port, server_pids

REPO = Path(__file__).resolve().parent.parent
TOUR = [str(REPO / "examples" / "agent_interaction" / "parallel_infer.py"),
        "--agent-config-path", str(REPO / "examples" / "agent_interaction" / "agent_config_local.yaml"),
        "--n", "2", "--max-samples", "2", "--num-workers", "2", "--max-turns", "3", "--max-tokens", "256",
        "--no-progress"]


def kill_once(log: Path, after: int, done: threading.Event, kills: list[float]) -> None:
    while not done.wait(0.05):
        port = engine_port(log)
        if port is None or answered(log) < after:
            continue
        for pid in server_pids(port):
            os.kill(pid, signal.SIGKILL)
            kills.append(time.monotonic())
        if kills:
            return


def tour(out: Path, kill_after: int | None) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    done, kills = threading.Event(), []
    if kill_after is not None:
        threading.Thread(target=kill_once, args=(out / "logs" / "engine-0.log", kill_after, done, kills),
                         daemon=True).start()
    started = time.monotonic()
    proc = subprocess.run([sys.executable, *TOUR, "--output-dir", str(out)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    wall = time.monotonic() - started
    done.set()
    files = sorted((out / "results").glob("part-*.parquet"))
    rows = pd.concat([pd.read_parquet(f) for f in files]) if files else pd.DataFrame({"failure_kind": []})
    events = [json.loads(line) for f in (out / "logs").glob("driver-*.jsonl") for line in f.read_text().splitlines()]
    down = [e["down_s"] for e in events if e.get("event") == "engine_restarted" and e.get("down_s") is not None]
    return {"exit": proc.returncode, "finished": len(rows), "infra": int((rows.failure_kind == "infra").sum()),
            "wall_s": wall, "killed_at_s": kills[0] - started if kills else None, "down_s": down,
            "stderr_tail": proc.stderr[-1500:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--after", type=int, default=4, help="kill once the server has answered this many calls")
    parser.add_argument("--baseline", action="store_true", help="first run the tour without a kill")
    parser.add_argument("--out", default="outputs/fault-tour")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    runs = {}
    if args.baseline:
        runs["no kill"] = tour(out / "baseline", None)
    runs["engine killed once"] = tour(out / "killed", args.after)
    print(f"{'run':<20} {'exit':>4} {'finished':>8} {'infra':>5} {'killed at':>9} {'engine down':>11} {'wall':>7}")
    for name, r in runs.items():
        killed = f"{r['killed_at_s']:.1f} s" if r["killed_at_s"] is not None else "-"
        down = ", ".join(f"{d:.2f} s" for d in r["down_s"]) or "-"
        print(f"{name:<20} {r['exit']:>4} {r['finished']:>8} {r['infra']:>5} {killed:>9} {down:>11} "
              f"{r['wall_s']:>5.1f} s")
    killed = runs["engine killed once"]
    if killed["killed_at_s"] is None:
        print("the engine was not killed: the run ended before it answered --after calls", file=sys.stderr)
        return 1
    if killed["exit"] != 0:
        print(killed["stderr_tail"], file=sys.stderr)
    return 0 if killed["exit"] == 0 and killed["infra"] == 0 and killed["finished"] == 4 else 1


if __name__ == "__main__":
    sys.exit(main())
