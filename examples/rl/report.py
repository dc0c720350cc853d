"""The figures of a train.py run: a table per step and a PNG (reward per step, held-out before/after, seconds per
step split into rollouts, training and weight switch, and the engine-vs-trainer logprob gap).

    python examples/rl/report.py outputs/rl-train --png docs/rl-reward.png       # needs matplotlib for the PNG
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def load(run: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    summary_file = run / "summary.json"
    return steps, json.loads(summary_file.read_text()) if summary_file.exists() else {}


def table(steps: list[dict[str, Any]], summary: dict[str, Any]) -> str:
    lines = ["step | mode | version | reward | call/args/plain | rollouts s | training s | weight switch s "
             "(export + update) | step s | gap |dlogp| | kl | tokens per version | spanning | inconsistent"]
    for m in steps:
        s, lv, v = m["seconds"], m["reward_by_level"], m["versions"]
        lines.append(
            f"{m['step']} | {m['mode']} | {m['policy_version']} | {m['reward_mean']:.3f} | "
            f"{lv.get('call', 0):.2f}/{lv.get('args', 0):.2f}/{lv.get('plain', 0):.2f} | {s['rollouts']} | "
            f"{s['training']} | {s['weight_switch']} ({s['export']} + {s['switch']}) | {s['step']} | "
            f"{m['gap']['abs_mean']:.4f} | {m['gap']['kl_k3']:.5f} | {v['tokens_per_version']} | {v['spanning']} | "
            f"{v['inconsistent']}")
    for when in ("heldout_before", "heldout_after"):
        h = summary.get(when) or {}
        if h:
            lines.append(f"{when}: version {h['version']}, reward {h['reward_mean']} over {h['rollouts']} "
                         f"rollouts, by level {h['reward_by_level']}")
    for mode in ("sync", "async"):
        chosen = [m for m in steps if m["mode"] == mode]
        if chosen:
            avg = {k: round(sum(m["seconds"][k] for m in chosen) / len(chosen), 2)
                   for k in ("rollouts", "training", "weight_switch", "step")}
            lines.append(f"{mode} steps: {len(chosen)}, mean seconds {avg}")
    return "\n".join(lines)


def plot(steps: list[dict[str, Any]], summary: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    x = [m["step"] for m in steps]
    ax = axes[0]
    ax.plot(x, [m["reward_mean"] for m in steps], "o-", color="black", label="all training tasks")
    for level, style in (("call", "--"), ("args", ":"), ("plain", "-.")):
        ax.plot(x, [m["reward_by_level"].get(level, 0) for m in steps], style, label=f"level {level}")
    asyncs = [m["step"] for m in steps if m["mode"] == "async"]
    if asyncs:
        ax.axvspan(min(asyncs) - 0.5, max(asyncs) + 0.5, color="0.9", label="asynchronous steps")
    ax.set(xlabel="step", ylabel="mean reward", title="Reward per step (GRPO, SmolLM2-135M)", ylim=(-0.02, 1.02))
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)
    ax = axes[1]
    before, after = summary.get("heldout_before") or {}, summary.get("heldout_after") or {}
    levels = ["all", "call", "args", "plain"]
    values = lambda h: [h.get("reward_mean", 0)] + [h.get("reward_by_level", {}).get(k, 0) for k in levels[1:]]  # noqa: E731
    width = 0.38
    ax.bar([i - width / 2 for i in range(4)], values(before), width, label=f"before (v{before.get('version', 0)})")
    ax.bar([i + width / 2 for i in range(4)], values(after), width, label=f"after (v{after.get('version', '?')})")
    ax.set_xticks(range(4), levels)
    ax.set(ylabel="mean reward", title="Held-out tasks, before and after", ylim=(0, 1.02))
    ax.legend(fontsize=8)
    ax = axes[2]
    bottom = [0.0] * len(steps)
    for key, label in (("rollouts", "rollouts (wait)"), ("training", "training"), ("export", "GGUF export"),
                       ("switch", "update_weights")):
        heights = [m["seconds"][key] for m in steps]
        ax.bar(x, heights, bottom=bottom, label=label)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set(xlabel="step", ylabel="seconds", title="Seconds per step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="train.py's --out (metrics.jsonl, summary.json)")
    parser.add_argument("--png", type=Path, default=None)
    args = parser.parse_args()
    steps, summary = load(args.run)
    print(table(steps, summary))
    if args.png:
        plot(steps, summary, args.png)
        print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
