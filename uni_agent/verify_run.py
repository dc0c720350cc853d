"""Grade a fixed patch (each task's gold patch, or an empty one) for every row, in parallel as Dask futures.

A sanity check of the tasks and the grader: gold should resolve every task, empty none. No LLM is involved."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from .config import AgentConfigs, ConfigError
from .dataset import build_specs
from .runner import RunOutcome, _cluster_client, _load_rows, _sandbox_workers, resolve_path
from .settings import RunSettings, load_settings
from .verify import verify_patch

BUCKETS = ("resolved", "wrong_answer", "timeout_or_error")


def _bucket(status: str) -> str:
    if status == "resolved":
        return "resolved"
    return "wrong_answer" if status in ("unresolved", "patch_failed") else "timeout_or_error"


def verify_all(data: Any = None, agent_config: Any = None, settings: RunSettings | None = None,
               patch: Literal["gold", "empty"] = "gold", **overrides: Any) -> RunOutcome:
    settings = load_settings(settings, **overrides)
    return asyncio.run(_verify_all(data, agent_config, settings, patch))


async def _verify_all(data: Any, agent_config: Any, settings: RunSettings, patch: str) -> RunOutcome:
    started = time.monotonic()
    output_dir = Path(settings.output_dir).expanduser().resolve()
    agents = agent_config if isinstance(agent_config, AgentConfigs) else AgentConfigs.load(
        resolve_path(agent_config or settings.agent_config_path))
    rows, source = _load_rows(data, settings, output_dir)
    if settings.max_samples >= 0:
        rows = rows[: settings.max_samples]
    specs, problems = build_specs(rows, agents, f"verify-{patch}", 1, source)
    for problem in problems:
        print(f"skipped: {problem.error}", file=sys.stderr)
    if not specs:
        raise ConfigError(f"{source}: no valid rows to verify")
    records = []
    async with _cluster_client(settings, None) as client:
        workers = await _sandbox_workers(client)
        futures = {
            spec.instance_id: client.submit(
                verify_patch, spec.agent, spec.agent.reward.metadata["patch"] if patch == "gold" else "",
                f"{spec.instance_id}-{patch}", pure=False, resources={"SANDBOX": 1} if workers else None)
            for spec in specs
        }
        for instance_id, future in futures.items():
            outcome = await future
            records.append({"instance_id": instance_id, "patch_kind": patch, "bucket": _bucket(outcome.status),
                            "status": outcome.status, "reward": outcome.reward, "patch_applied": outcome.patch_applied,
                            "verify_s": outcome.seconds, "error": outcome.error,
                            "verification": outcome.to_json()})
    results = pd.DataFrame.from_records(records)
    output_dir.mkdir(parents=True, exist_ok=True)
    results.to_parquet(output_dir / f"verify_{patch}.parquet", index=False)
    counts = results["bucket"].value_counts()
    summary = {
        "num_tasks": len(specs), "n": 1, "num_rollouts": len(results), "patch": patch,
        "avg_at_n": round(float(results["reward"].mean()), 4), "resolved": int(counts.get("resolved", 0)),
        **{f"{bucket}_ids": sorted(results.loc[results["bucket"] == bucket, "instance_id"]) for bucket in BUCKETS},
        "exit_reasons": {bucket: int(counts.get(bucket, 0)) for bucket in BUCKETS},
        "rejected_rows": len(problems), "wall_seconds": round(time.monotonic() - started, 2),
    }
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return RunOutcome(results, summary, problems)
