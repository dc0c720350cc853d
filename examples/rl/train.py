"""A real RL loop: GRPO on SmolLM2-135M-Instruct over the setting-edit tasks, rollouts from the rollout service.

    python examples/rl/train.py --steps 12 --out outputs/rl-train                        # CPU engine, CPU trainer
    python examples/rl/train.py --gpu --steps 30 --time-budget 500 --out /tmp/rl         # GPU machine (docs/online.md)
    python examples/rl/train.py --tiny --steps 2 --n 2 --train-tasks 2 --heldout-tasks 0 # the pipeline, a random model

Each step: the training tasks x n rollouts from the served version (uni_agent.online.RolloutService), taken group by
group; GRPO advantages within each task's group, one training step in PyTorch on the policy (transformers' Llama,
loaded from the served GGUF: uni_agent.training), the new weights written as a GGUF by llama.cpp's own converter and
switched in with update_weights. Synchronous by default; from step --async-from on, the next batch runs on the old
version while the trainer trains and the update lands under it (max_staleness bounds how old a token may be).
Before and after, the held-out tasks (same family, other setting names) are evaluated at the same temperature.

Prints a line per step and writes <out>/metrics.jsonl (one object per step) and <out>/summary.json; plot them with
examples/rl/report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from uni_agent.engines.llama_cpp import default_model_path
from uni_agent.online import RolloutService
from uni_agent.tasks.setting_edits import task_rows, write_tasks
from uni_agent.training.gguf_export import export_gguf
from uni_agent.training.policy import load_policy, load_tokenizer, tiny_policy
from uni_agent.training.trainer import GRPOTrainer, TrainConfig, examples_from_groups
from uni_agent.training.version_audit import audit_versions

HERE = Path(__file__).resolve().parent


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=Path("outputs/rl-train"))
    p.add_argument("--model", default=None, help="GGUF to start from (default: the bundled SmolLM2-135M-Instruct)")
    p.add_argument("--tiny", action="store_true", help="a random 2-layer model over the model's vocabulary")
    p.add_argument("--tokenizer", default=None, help="--tiny: a folder of tokenizer files instead of --model's")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--time-budget", type=float, default=0, help="seconds: start no step that would end after it "
                   "(leaving time for the held-out evaluation); 0: no limit")
    p.add_argument("--train-tasks", type=int, default=16)
    p.add_argument("--heldout-tasks", type=int, default=8)
    p.add_argument("--n", type=int, default=8, help="rollouts per task (a GRPO group)")
    p.add_argument("--eval-n", type=int, default=4, help="rollouts per held-out task")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--micro-tokens", type=int, default=16384)
    p.add_argument("--tis-cap", type=float, default=2.0)
    p.add_argument("--async-from", type=int, default=-1, help="first step whose next batch runs during training")
    p.add_argument("--max-staleness", type=int, default=1)
    p.add_argument("--gpu", action="store_true", help="llama-servers on this machine's GPU (a cluster of our own)")
    p.add_argument("--servers", type=int, default=4, help="llama-servers on the GPU")
    p.add_argument("--engine-device", default="gpu", help="--gpu: where the cluster's engines run (cpu: to try the "
                   "cluster's processes on a machine without a GPU)")
    p.add_argument("--slots", type=int, default=0, help="engine slots in all (default: every rollout of a batch)")
    p.add_argument("--sandbox-workers", type=int, default=4, help="--gpu: sandbox worker processes")
    p.add_argument("--sandbox-threads", type=int, default=3, help="--gpu: threads per sandbox worker")
    p.add_argument("--context-length", type=int, default=4096)
    p.add_argument("--test-cmd", default=None, help="the graders' test command (default: python -m pytest ...)")
    p.add_argument("--sdist", default=None, help="the llama-cpp-python sdist holding the converter")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    began = time.monotonic()
    out = args.out.resolve()
    (out / "weights").mkdir(parents=True, exist_ok=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # full F32: the gap to the engine is then the engine's own
    torch.manual_seed(args.seed)
    base = args.model or (None if args.tokenizer else default_model_path())
    if args.tiny:
        tokenizer = load_tokenizer(args.tokenizer or base)
        model = tiny_policy(tokenizer, seed=args.seed, device=device)
    else:
        model, tokenizer = load_policy(base, device=device)
    loaded = time.monotonic()
    v0 = out / "weights" / "v0.gguf"
    first_export = export_gguf(model, tokenizer, v0, work_dir=out / "hf", sdist=args.sdist)
    print(f"policy on {device} in {loaded - began:.1f} s; v0 GGUF in {first_export.seconds:.1f} s", flush=True)

    train = task_rows(write_tasks(out / "tasks" / "train", "train", args.train_tasks, args.seed, args.test_cmd))
    heldout = task_rows(write_tasks(out / "tasks" / "heldout", "heldout", args.heldout_tasks, args.seed,
                                    args.test_cmd)) if args.heldout_tasks else []
    levels = {r["instance_id"]: json.loads((out / "tasks" / s / r["instance_id"] / "instance.json").read_text())
              ["level"] for s, rs in (("train", train), ("heldout", heldout)) for r in rs}
    batch_size = args.train_tasks * args.n
    agent_config = out / "agent.yaml"
    agents = yaml.safe_load((HERE / "agent_rl.yaml").read_text())
    agents[0]["concurrency"] = max(batch_size * 2, args.heldout_tasks * args.eval_n)  # async: two batches at once
    agent_config.write_text(yaml.safe_dump(agents))
    trainer = GRPOTrainer(model, TrainConfig(lr=args.lr, epochs=args.epochs, minibatches=args.minibatches,
                                             micro_tokens=args.micro_tokens, tis_cap=args.tis_cap,
                                             seed=args.seed), device=device)
    engine = dict(engine="llama_cpp", model_path=str(v0), verify=True, max_turns=args.max_turns,
                  max_tokens=args.max_tokens, temperature=args.temperature, top_p=1.0, dashboard=False,
                  context_length=args.context_length, engine_parallel=args.slots or batch_size)
    async with contextlib.AsyncExitStack() as stack:
        if args.gpu:
            from gpu_cluster import gpu_cluster

            scheduler_file, tls = stack.enter_context(gpu_cluster(
                out / "cluster", sandbox_workers=args.sandbox_workers, sandbox_threads=args.sandbox_threads))
            engine.update(scheduler_file=str(scheduler_file), tls_dir=str(tls), engine_device=args.engine_device,
                          n_gpus_per_node=1, engine_servers_per_gpu=args.servers)
        service = await RolloutService.start(agent_config, output_dir=str(out / "service"),
                                             max_staleness=args.max_staleness, **engine)
        stack.push_async_callback(service.close)
        started = time.monotonic()
        print(f"service up in {started - loaded - first_export.seconds:.1f} s: {service.engines.urls}", flush=True)
        summary: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "device": device,
                                   "first_export_s": first_export.seconds}
        summary["heldout_before"] = await evaluate(service, heldout, args, levels, "before")
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))  # a run cut short keeps it
        eval_s = summary["heldout_before"].get("seconds", 0.0)
        step_times: list[float] = []
        metrics_file = out / "metrics.jsonl"
        metrics_file.write_text("")
        batch = await service.submit(train, n=args.n, step=0)
        step = 0
        for step in range(args.steps):
            step_began = time.monotonic()
            groups = [g async for g in batch.groups()]
            rollout_s = time.monotonic() - step_began
            results = [r for g in groups for r in g.results]
            audit = audit_versions(results, current_version=service.version, max_staleness=args.max_staleness)
            last = step + 1 == args.steps or over_budget(args, began, step_times, eval_s)
            mode = "async" if 0 <= args.async_from <= step and not last else "sync"
            asked_version = batch.version
            if mode == "async":  # the next batch samples from the version now serving while we train
                batch = await service.submit(train, n=args.n, step=step + 1)
            stats = trainer.step(examples_from_groups(groups), version=service.version)
            weights = out / "weights" / f"v{service.version + 1}.gguf"
            exported = export_gguf(model, tokenizer, weights, work_dir=out / "hf", sdist=args.sdist)
            report = await service.update_weights(service.version + 1, str(weights))
            prune_weights(out / "weights", keep=(service.version, service.version - 1))
            if mode == "sync" and not last:
                batch = await service.submit(train, n=args.n, step=step + 1)
            step_s = time.monotonic() - step_began
            step_times.append(step_s)
            record = {
                "step": step, "mode": mode, "policy_version": asked_version, "rollouts": len(results),
                "reward_mean": mean([r.reward for r in results]), "reward_by_level": by_level(results, levels),
                "groups_with_signal": sum(len(set(g.rewards)) > 1 for g in groups), "groups": len(groups),
                "seconds": {"rollouts": round(rollout_s, 2), "training": stats["train_s"],
                            "export": exported.seconds, "switch": round(report.seconds, 2),
                            "weight_switch": round(exported.seconds + report.seconds, 2), "step": round(step_s, 2)},
                "update_pause_s": round(report.max_pause_s, 2), "gap": stats["gap"], "versions": audit,
                "trainer": {k: v for k, v in stats.items() if k != "gap"},
                "completion_tokens": sum(int(r.completion_tokens or 0) for r in results),
            }
            metrics_file.open("a").write(json.dumps(record) + "\n")
            print(step_line(record), flush=True)
            if last:
                break
        summary["steps"] = step + 1
        summary["final_version"] = service.version
        summary["heldout_after"] = await evaluate(service, heldout, args, levels, "after")
        summary["service_stats"] = {k: v for k, v in (await service.stats()).items() if k != "engines"}
        summary["wall_s"] = round(time.monotonic() - began, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    before, after = summary["heldout_before"], summary["heldout_after"]
    print(f"held-out reward: before {before.get('reward_mean')} {before.get('reward_by_level')}, after "
          f"{after.get('reward_mean')} {after.get('reward_by_level')}; wall {summary['wall_s']} s", flush=True)
    return summary


async def evaluate(service: RolloutService, rows: list[dict], args: argparse.Namespace, levels: dict[str, str],
                   when: str) -> dict[str, Any]:
    """The held-out tasks x eval_n at the serving version; mean reward overall and per level."""
    if not rows:
        return {}
    began = time.monotonic()
    batch = await service.submit(rows, n=args.eval_n, step=-1 if when == "before" else -2)
    results = await batch.results()
    figures = {"version": service.version, "rollouts": len(results), "reward_mean": mean([r.reward for r in results]),
               "reward_by_level": by_level(results, levels), "seconds": round(time.monotonic() - began, 1)}
    print(f"held-out {when} (version {service.version}): reward {figures['reward_mean']} over {len(results)} "
          f"rollouts, by level {figures['reward_by_level']} ({figures['seconds']} s)", flush=True)
    return figures


def over_budget(args: argparse.Namespace, began: float, step_times: list[float], eval_s: float) -> bool:
    """Would one more step (as long as the slowest so far) and the evaluation end past the time budget?"""
    if not args.time_budget or not step_times:
        return False
    return time.monotonic() - began + 2 * max(step_times) + eval_s + 30 > args.time_budget


def prune_weights(folder: Path, keep: tuple[int, ...]) -> None:
    """Old versions' GGUFs go (the current one serves; the one before is what a failed update falls back to)."""
    for path in folder.glob("v*.gguf"):
        if int(path.stem[1:]) not in keep:
            path.unlink()


def by_level(results: list[Any], levels: dict[str, str]) -> dict[str, float]:
    rewards: dict[str, list[float]] = {}
    for r in results:
        rewards.setdefault(levels.get(r.instance_id, "?"), []).append(r.reward)
    return {level: mean(values) for level, values in sorted(rewards.items())}


def mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 4) if values else 0.0


def stale_gap(gap: dict[str, Any]) -> str:
    older = gap.get("older_versions") or {}
    if not older.get("tokens"):
        return ""
    return (f" (current version {gap['current_version']['abs_mean']:.4f}, older versions {older['abs_mean']:.4f} over "
            f"{older['tokens']} tokens)")


def step_line(m: dict[str, Any]) -> str:
    s, v, g = m["seconds"], m["versions"], m["gap"]
    return (f"step {m['step']} [{m['mode']}] v{m['policy_version']}: reward {m['reward_mean']:.3f} "
            f"{m['reward_by_level']} ({m['rollouts']} rollouts, {m['groups_with_signal']}/{m['groups']} groups "
            f"with signal) | s: rollouts {s['rollouts']}, training {s['training']}, weight switch "
            f"{s['weight_switch']} (export {s['export']}, update {s['switch']}), step {s['step']} | gap "
            f"|dlogp| {g['abs_mean']:.4f} over {g['tokens']} tokens, kl {g['kl_k3']:.5f}{stale_gap(g)} | versions "
            f"{v['tokens_per_version']}, spanning {v['spanning']}, masked {v['masked_stale']}, inconsistent "
            f"{v['inconsistent']} | loss {m['trainer']['loss']:.4f}, clip {m['trainer']['clip_fraction']:.3f}")


if __name__ == "__main__":  # the service's LocalCluster spawns worker processes: the guard is required
    asyncio.run(main(parse()))
