"""An online RL loop that runs on the CPU: N steps of generate -> train -> update the engines' weights.

    python examples/rl/loop.py --steps 3 --n 2 --max-samples 2          # needs `pip install 'uni-agent[rl]'`

Each step asks the rollout service (uni_agent.online) for the bundled tasks x n rollouts from SmolLM2 served by
llama-server, takes them back group by group (the n rollouts of a task together, as a GRPO trainer would), turns
them into verl's agent-loop fields (uni_agent.training.formats), then runs a STAND-IN training step: it learns
nothing, it writes the GGUF with its norm weights perturbed (uni_agent.training.standin) so that the next version
really is different weights. update_weights restarts the llama-server on the new file and the next step samples
from it. With --async the next batch is already running while the "trainer" works and the update happens under it
(its rollouts carry both versions, in order). docs/online.md has the recipe for a real trainer on GPUs.

Per step it prints: the step, the version the batch asked for, rollouts, mean reward, sampled tokens per version (as the
rows record them), and the update's time (all replicas on the new weights) and pause (no new calls to a replica).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import Counter
from pathlib import Path

from uni_agent.driver.dataset import read_rows
from uni_agent.engines.llama_cpp import default_model_path
from uni_agent.online import RolloutService
from uni_agent.tasks.swe_form import convert
from uni_agent.training.formats import verl_agent_loop_outputs
from uni_agent.training.standin import perturb_gguf


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--n", type=int, default=2, help="rollouts per task (a group)")
    parser.add_argument("--max-samples", type=int, default=2, help="bundled tasks per batch")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--max-staleness", type=int, default=None)
    parser.add_argument("--async", dest="overlap", action="store_true",
                        help="run the next batch while training and updating (asynchronous RL)")
    parser.add_argument("--output-dir", default="outputs/rl")
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    out = Path(args.output_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    convert(None, out / "tasks.parquet")
    rows = read_rows(out / "tasks.parquet")[: args.max_samples]
    base = default_model_path()
    service = await RolloutService.start(output_dir=str(out / "service"), engine="llama_cpp", verify=True,
                                         max_turns=args.max_turns, max_tokens=args.max_tokens,
                                         max_staleness=args.max_staleness)
    async with service:
        batch = await service.submit(rows, n=args.n, step=0)
        for step in range(args.steps):
            started = time.monotonic()
            groups = [group async for group in batch.groups()]
            results = [r for g in groups for r in g.results]
            # What a trainer takes (fields of verl's AgentLoopOutput) and a group baseline for each rollout.
            examples = verl_agent_loop_outputs(results, drop_unusable=True)
            advantages = [r.reward - statistics.fmean(g.rewards) for g in groups for r in g.results]
            tokens = Counter(v for r in results for v in r.token_versions if v >= 0)
            if args.overlap and step + 1 < args.steps:  # the next batch runs while the trainer works
                batch = await service.submit(rows, n=args.n, step=step + 1)
            new_version = step + 1
            weights = out / "weights" / f"policy-v{new_version}.gguf"
            perturb_gguf(base, weights, seed=new_version)  # the stand-in training step
            report = await service.update_weights(new_version, str(weights))
            print(f"step {step}: asked for version {results[0].policy_version if results else '-'}, {len(results)} rollouts "
                  f"({len(examples)} trainable), mean reward {statistics.fmean(r.reward for r in results):.2f}, "
                  f"advantages {[round(a, 2) for a in advantages]}, tokens per version {dict(sorted(tokens.items()))},"
                  f" update {report.seconds:.2f} s (pause {report.max_pause_s:.2f} s), step {time.monotonic() - started:.1f} s",
                  flush=True)
            if not args.overlap and step + 1 < args.steps:
                batch = await service.submit(rows, n=args.n, step=step + 1)
        stats = await service.stats()
        print(f"rows in {out / 'service' / 'results'}; tokens per version {stats['tokens_per_version']}; "
              f"rollouts per version {stats['rollouts_per_version']}")


if __name__ == "__main__":  # LocalCluster spawns worker processes: the guard is required
    asyncio.run(main(parse()))
