"""The run summary (summary.json): Avg@N, pass@k, exit reasons, failure kinds, throughput.

Avg@N is over all rollouts, infrastructure failures included (they score 0); `infra_failures` counts them apart, with
`avg_at_n_without_infra` beside it, so that an outage is never read as a model result."""

from __future__ import annotations

from math import comb
from typing import Any

import pandas as pd

from ..episode.exit_reason import EXIT_REASONS
from ..episode.failures import FAILURE_KINDS, FailureKind


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one task with n rollouts of which c passed."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarize(results: pd.DataFrame, *, num_tasks: int, n: int, wall_seconds: float, extra: dict | None = None
              ) -> dict[str, Any]:
    rewards = results["reward"].astype(float) if len(results) else pd.Series(dtype=float)
    exit_reasons = {reason: 0 for reason in EXIT_REASONS}
    for reason, count in results["exit_reason"].value_counts().items() if len(results) else []:
        exit_reasons[str(reason)] = int(count)
    # rollouts and passes per task counted by pandas at once: a comparison per task's group took 5.8 s at 25,000
    # tasks (100,000 rollouts), after the work was done
    if len(results):
        passes = (rewards >= 1).groupby(results["instance_id"])
        tries, passed = passes.size(), passes.sum()
    else:
        tries = passed = pd.Series(dtype=int)
    pass_k: dict[str, float] = {}
    for k in sorted({1, n}):
        scores = [pass_at_k(t, int(c), k) for t, c in zip(tries.tolist(), passed.tolist(), strict=True) if t >= k]
        if scores:
            pass_k[f"pass@{k}"] = round(sum(scores) / len(scores), 4)
    summary = {
        "num_tasks": num_tasks,
        "n": n,
        "num_rollouts": int(len(results)),
        "avg_at_n": round(float(rewards.mean()), 4) if len(rewards) else 0.0,
        "resolved": int((rewards >= 1).sum()),
        "resolved_instances": int(passed.ge(1).sum()),
        **pass_k,
        "exit_reasons": exit_reasons,
        "errors": int(results["error"].notna().sum()) if len(results) else 0,
        **failure_counts(results),
        "wall_seconds": round(wall_seconds, 2),
        "rollouts_per_minute": round(len(results) / wall_seconds * 60, 2) if wall_seconds > 0 else 0.0,
    }
    if len(results):
        summary["mean_seconds"] = {
            col.removesuffix("_s"): round(float(results[col].mean()), 3)
            for col in ("sandbox_start_s", "llm_s", "tools_s", "verify_s", "total_s")
        }
    summary.update(extra or {})
    return summary


def failure_counts(results: pd.DataFrame) -> dict[str, Any]:
    """failure_kinds (none/model/infra), infra_failures with their causes by part, Avg@N without the infra rows."""
    has_kinds = len(results) and "failure_kind" in results
    kinds = results["failure_kind"].fillna(FailureKind.NONE.value) if has_kinds else None
    counts = {kind: 0 for kind in FAILURE_KINDS}
    causes: dict[str, int] = {}
    if kinds is not None:
        for kind, count in kinds.value_counts().items():
            counts[str(kind)] = int(count)
        for cause in results.loc[kinds == FailureKind.INFRA, "failure_cause"].fillna("unknown"):
            part = str(cause).split(":", 1)[0]
            causes[part] = causes.get(part, 0) + 1
    clean = results[kinds != FailureKind.INFRA] if kinds is not None else results
    return {
        "failure_kinds": counts,
        "infra_failures": counts[FailureKind.INFRA],
        "infra_failure_parts": causes,
        "avg_at_n_without_infra": round(float(clean["reward"].astype(float).mean()), 4) if len(clean) else None,
    }


INFRA_FAILURE_LIMIT = 0.5  # above this share of infra failures a run is an outage, not a model result


def infra_outage(summary: dict[str, Any], limit: float = INFRA_FAILURE_LIMIT) -> str | None:
    """Why the run must exit non-zero, when more than `limit` of its rollouts failed for infrastructure reasons
    (sandboxes, engine, cluster): their reward 0 says nothing about the model. None for a run that measured it."""
    total, infra = summary.get("num_rollouts", 0), summary.get("infra_failures", 0)
    if not total or infra <= limit * total:
        return None
    parts = ", ".join(f"{part}: {count}" for part, count in sorted(
        summary.get("infra_failure_parts", {}).items(), key=lambda item: -item[1]))
    return (f"{infra} of {total} rollouts failed for infrastructure reasons ({parts or 'unknown'}), so the scores "
            "measure the infrastructure, not the model; the rows' failure_cause and logs/ say what broke")

