"""The online service's figures, measured in one run on this machine's CPU (llama-server + SmolLM2, real sandboxes).

    python examples/rl/bench.py --steps 2 --n 2 --max-samples 2 --out outputs/rl-bench

1. update pause: update_weights with a batch in flight and with none: the time until every replica serves the new
   version, and the pause (a replica taking no new call) within it.
2. a step boundary, synchronous vs asynchronous: `steps` steps of generate -> stand-in train -> update_weights,
   once waiting for each batch before training and updating (sync), once with the next batch already running while
   the trainer works and the update happens under it (async); rollouts per minute over the whole loop, both printed.
3. the service against parallel_infer.py on the same batch (the same rows x n, temperature 0 so both sample the
   same tokens), alternating `repeats` times: rollouts per minute over the rollouts' own span (first start to last
   finish, read from the rows), which leaves out what only one of them pays (cluster and engine start);
   parallel_infer's end-to-end rate too. Measured first (its own service, at temperature 0), then 1 and 2 (a service
   sampling at the default temperature, so that rollouts go on for several turns and an update can fall mid-way).
The stand-in trainer step (uni_agent.training.standin) writes a perturbed GGUF (about 2 s here); --train-s adds the
seconds a real trainer's step would take, during which the async loop keeps generating.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from uni_agent.driver.dataset import read_rows
from uni_agent.engines.llama_cpp import default_model_path
from uni_agent.online import RolloutService
from uni_agent.tasks.swe_form import convert
from uni_agent.training.standin import perturb_gguf

REPO = Path(__file__).resolve().parents[2]


def rollout_span_rate(frame: pd.DataFrame) -> float:
    """Rollouts per minute over first start .. last finish, from the rows' own timestamps."""
    span = frame["finished_at"].max() - frame["started_at"].min()
    return len(frame) / span * 60 if span > 0 else 0.0


async def loop(service: RolloutService, rows: list, args: argparse.Namespace, overlap: bool, first_version: int,
               weights: Path) -> dict:
    base, started, count, pauses = default_model_path(), time.monotonic(), 0, []
    batch = await service.submit(rows, n=args.n)
    for step in range(args.steps):
        results = await batch.results()
        count += len(results)
        if overlap and step + 1 < args.steps:
            batch = await service.submit(rows, n=args.n)
        version = first_version + step + 1
        path = weights / f"v{version}.gguf"
        perturb_gguf(base, path, seed=version)  # the stand-in training step
        await asyncio.sleep(args.train_s)  # the rest of a trainer's step, when asked for
        report = await service.update_weights(version, str(path))
        pauses.append(round(report.max_pause_s, 2))
        if not overlap and step + 1 < args.steps:
            batch = await service.submit(rows, n=args.n)
    seconds = time.monotonic() - started
    return {"rollouts": count, "seconds": round(seconds, 1), "rollouts_per_min": round(count / seconds * 60, 2),
            "pauses_s": pauses}


async def service_figures(rows: list, args: argparse.Namespace, out: Path) -> dict:
    figures: dict = {}
    base = default_model_path()
    weights = out / "weights"
    service = await RolloutService.start(output_dir=str(out / "service-t0"), engine="llama_cpp", verify=False,
                                         max_turns=args.max_turns, max_tokens=args.max_tokens, temperature=0.0)
    async with service:
        # 3. the same batch as parallel_infer, alternating with it (the machine's load moves; pairs side by side).
        # Before each service batch the engine restarts on the base model (a new version of the same weights): its
        # prompt cache is as cold as parallel_infer's fresh server.
        service_rates, infer_runs = [], []
        for i in range(args.repeats):
            await service.update_weights(service.version + 1, base)
            batch = await service.submit(rows, n=args.n)
            results = pd.DataFrame([r.row() for r in await batch.results()])
            service_rates.append(round(rollout_span_rate(results), 2))
            infer_runs.append(await asyncio.to_thread(parallel_infer, args, out / "tasks.parquet",
                                                      out / f"parallel_infer-{i}"))
        ratios = [a / b["span_rollouts_per_min"] for a, b in zip(service_rates, infer_runs, strict=True)]
        figures["throughput"] = {
            "service_span_rollouts_per_min": service_rates,
            "parallel_infer_span_rollouts_per_min": [r["span_rollouts_per_min"] for r in infer_runs],
            "parallel_infer_end_to_end_rollouts_per_min": [r["end_to_end_rollouts_per_min"] for r in infer_runs],
            "completion_tokens": {"service": int(results["completion_tokens"].sum()),
                                  "parallel_infer": infer_runs[-1]["completion_tokens"]},
            "ratio_per_pair": [round(x, 3) for x in ratios], "ratio_median": round(statistics.median(ratios), 3)}
    # 1 and 2 sample as a run does (temperature 0.8): rollouts differ, and most go on for several turns.
    service = await RolloutService.start(output_dir=str(out / "service"), engine="llama_cpp", verify=False,
                                         max_turns=args.max_turns, max_tokens=args.max_tokens)
    async with service:
        # 1. update pause, idle and under load
        v = service.version
        perturb_gguf(base, weights / "p1.gguf", seed=101)
        perturb_gguf(base, weights / "p2.gguf", seed=102)
        idle = await service.update_weights(v + 1, str(weights / "p1.gguf"))
        done = sum(e["calls_done"] for e in (await service.stats())["engines"].values())
        batch = await service.submit(rows, n=args.n)
        while sum(e["calls_done"] for e in (await service.stats())["engines"].values()) <= done:
            await asyncio.sleep(0.2)  # the batch has its first answers: its rollouts are mid-way
        loaded = await service.update_weights(v + 2, str(weights / "p2.gguf"))
        spanning = [r for r in await batch.results() if r.version_min == v + 1 and r.version_max == v + 2]
        figures["update"] = {
            "idle": {"seconds": round(idle.seconds, 2), "pause_s": round(idle.max_pause_s, 2)},
            "under_load": {"seconds": round(loaded.seconds, 2), "pause_s": round(loaded.max_pause_s, 2),
                           "calls_cut_off": sum(r.drain_left for r in loaded.replicas),
                           "rollouts_spanning_it": len(spanning), "rollouts": args.n * len(rows)}}
        # 2. sync vs async through step boundaries
        figures["sync"] = await loop(service, rows, args, False, service.version, weights)
        figures["async"] = await loop(service, rows, args, True, service.version, weights)
    return figures


def parallel_infer(args: argparse.Namespace, data: Path, out: Path) -> dict:
    command = [sys.executable, str(REPO / "examples/agent_interaction/parallel_infer.py"), "--data-path", str(data),
               "--n", str(args.n), "--max-turns", str(args.max_turns), "--max-tokens", str(args.max_tokens),
               "--temperature", "0", "--no-verify", "--no-progress", "--output-dir", str(out)]
    subprocess.run(command, check=True, env={**os.environ}, stdout=subprocess.DEVNULL)
    results = pd.read_parquet(out / "results")
    summary = json.loads((out / "summary.json").read_text())
    return {"rollouts": len(results), "span_rollouts_per_min": round(rollout_span_rate(results), 2),
            "end_to_end_rollouts_per_min": summary["rollouts_per_minute"],
            "completion_tokens": int(results["completion_tokens"].sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--n", type=int, default=2)
    parser.add_argument("--max-samples", type=int, default=2)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2, help="service / parallel_infer pairs")
    parser.add_argument("--train-s", type=float, default=0.0,
                        help="seconds a training step takes besides writing the weights (a real trainer's step)")
    parser.add_argument("--out", default="outputs/rl-bench")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    convert(None, out / "all.parquet")
    rows = read_rows(out / "all.parquet")[: args.max_samples]
    pd.DataFrame(rows).to_parquet(out / "tasks.parquet")
    figures: dict = {"args": vars(args)}
    figures.update(asyncio.run(service_figures(rows, args, out)))
    (out / "figures.json").write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))


if __name__ == "__main__":  # LocalCluster spawns worker processes: the guard is required
    main()
