"""Grade a fixed answer for every row, in parallel as Dask futures: each task's reference solution (`gold`, or
`oracle`: the gold patch of a SWE-style task, solution/solve.sh of a Terminal-Bench task) or no change (`empty`).

A sanity check of the tasks and the grader: gold/oracle should resolve every task, empty none. No LLM is involved.

Results go to <output_dir>/verify_<patch>.parquet as they arrive (rewritten every few results), and the summary to
<output_dir>/summary.json, with the reason of every timeout or error. The output dir defaults to outputs/verify-<patch>,
one per patch kind, so a gold check and an empty check never overwrite each other. A rerun with the same output dir
resumes: instances already graded (resolved / wrong_answer) are kept and not run again; those that
timed out or errored are run again, as the official harness reruns instances that left no report."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, get_args

import pandas as pd
from distributed import as_completed

from ..config import ConfigError
from ..private_dirs import preflight, prepare_output_dir, private_files
from .inputs import load_inputs
from .interrupt import run_until_stopped
from .run import RunOutcome
from .session import open_session
from ..settings import RunSettings, load_settings
from ..grading import ReferenceKind, Verification, verify_reference
from ..verification import VerificationStatus

BUCKETS = ("resolved", "wrong_answer", "timeout_or_error")
SAVE_EVERY = 16  # results between rewrites of verify_<patch>.parquet
MAX_REASON_CHARS = 500  # of each error's reason in summary.json (the whole one is in the Parquet file)
COLUMNS = ("instance_id", "patch_kind", "bucket", "status", "reward", "patch_applied", "verify_s", "error",
           "verification")


def _bucket(status: str) -> str:
    if status == VerificationStatus.RESOLVED:
        return "resolved"
    wrong = (VerificationStatus.UNRESOLVED, VerificationStatus.PATCH_FAILED)
    return "wrong_answer" if status in wrong else "timeout_or_error"


def verify_all(data: Any = None, agent_config: Any = None, settings: RunSettings | None = None,
               patch: ReferenceKind = "gold", **overrides: Any) -> RunOutcome:
    if patch not in get_args(ReferenceKind):
        raise ConfigError(f"patch={patch!r}: choose one of {', '.join(get_args(ReferenceKind))}")
    settings = load_settings(settings, **overrides)
    return run_until_stopped(_verify_all(data, agent_config, settings, patch))


async def _verify_all(data: Any, agent_config: Any, settings: RunSettings, patch: str) -> RunOutcome:
    with private_files(settings.share_with_group):
        return await _verify(data, agent_config, settings, patch)


async def _verify(data: Any, agent_config: Any, settings: RunSettings, patch: str) -> RunOutcome:
    started = time.monotonic()
    output_dir = settings.output_path(default_output_dir(patch))
    preflight(output_dir if output_dir.exists() else None, share_with_group=settings.share_with_group)
    inputs = load_inputs(data, agent_config, settings, output_dir, run_id=f"verify-{patch}", n=1, purpose="verify")
    specs, problems = inputs.specs, inputs.problems
    path = output_dir / f"verify_{patch}.parquet"
    records = _graded_before(path, {spec.instance_id for spec in specs})
    todo = [spec for spec in specs if spec.instance_id not in records]
    if records:
        print(f"resuming: {len(records)} instances already graded in {path}, {len(todo)} to run", file=sys.stderr)
    prepare_output_dir(output_dir, settings.share_with_group)
    if todo:
        async with open_session(settings, output_dir / "logs", agents=False) as session:
            client, placement = session.client, session.placement
            futures = {
                client.submit(
                    verify_reference, spec.agent, patch, f"{spec.instance_id}-{patch}", pure=False, **placement,
                ): spec.instance_id
                for spec in todo
            }
            unsaved = 0
            async for future in as_completed(futures):
                instance_id = futures[future]
                try:
                    outcome = await future
                except Exception as exc:  # the worker died or the task was lost: an error, not a crash of the run
                    outcome = Verification(status=VerificationStatus.ERROR, error=f"{type(exc).__name__}: {exc}")
                outcome.keep_log(output_dir, f"{instance_id}-{patch}")  # the whole test log, named by the row
                records[instance_id] = _record(instance_id, patch, outcome)
                unsaved += 1
                if unsaved >= SAVE_EVERY:
                    _save(records, path)
                    unsaved = 0
    order = {spec.instance_id: i for i, spec in enumerate(specs)}
    results = _save(records, path, order)
    counts = results["bucket"].value_counts()
    summary = {
        "num_tasks": len(specs), "n": 1, "num_rollouts": len(results), "patch": patch,
        "avg_at_n": round(float(results["reward"].mean()), 4), "resolved": int(counts.get("resolved", 0)),
        **{f"{bucket}_ids": sorted(results.loc[results["bucket"] == bucket, "instance_id"]) for bucket in BUCKETS},
        "exit_reasons": {bucket: int(counts.get(bucket, 0)) for bucket in BUCKETS},
        "errors": _reasons(results), "rejected_rows": len(problems),
        "wall_seconds": round(time.monotonic() - started, 2), "output_dir": str(output_dir), "results": str(path),
    }
    summary_path = output_dir / "summary.json"
    summary_path.write_text(json.dumps(summary, indent=2))
    print(f"verify {patch}: {summary['resolved']} of {len(specs)} resolved; results in {path}, summary in "
          f"{summary_path}", file=sys.stderr)
    return RunOutcome(results, summary, problems)


def default_output_dir(patch: str) -> str:
    """One default dir per patch kind (outputs/verify-gold, outputs/verify-empty, ...), apart from a run's."""
    return f"outputs/verify-{patch}"


def _reasons(results: pd.DataFrame) -> dict[str, str]:
    """instance_id -> why it timed out or errored (`status: error`), cut to MAX_REASON_CHARS with an ellipsis."""
    reasons = {}
    for row in results[results["bucket"] == "timeout_or_error"].itertuples():
        reason = f"{row.status}: {row.error}" if isinstance(row.error, str) and row.error else str(row.status)
        reasons[row.instance_id] = reason if len(reason) <= MAX_REASON_CHARS else reason[: MAX_REASON_CHARS - 1] + "…"
    return dict(sorted(reasons.items()))


def _record(instance_id: str, patch: str, outcome: Verification) -> dict[str, Any]:
    return dict(zip(COLUMNS, (instance_id, patch, _bucket(outcome.status), outcome.status, outcome.reward,
                              outcome.patch_applied, outcome.seconds, outcome.error, outcome.to_json()), strict=True))


def _graded_before(path: Path, wanted: set[str]) -> dict[str, dict[str, Any]]:
    """Records of a previous run of this output dir that need no rerun (graded, and still in the data)."""
    if not path.exists():
        return {}
    try:
        previous = pd.read_parquet(path)
    except Exception as exc:  # an unreadable file is redone from scratch, but said so
        print(f"warning: cannot read {path} ({exc}); verifying every instance again", file=sys.stderr)
        return {}
    keep = previous[previous["instance_id"].isin(wanted) & (previous["bucket"] != "timeout_or_error")]
    return {r["instance_id"]: r for r in keep.to_dict("records")}


def _save(records: dict[str, dict[str, Any]], path: Path, order: dict[str, int] | None = None) -> pd.DataFrame:
    """Write all records so far atomically (temp file, then rename): a crash never leaves a torn file."""
    rows = list(records.values())
    if order is not None:
        rows.sort(key=lambda r: order.get(r["instance_id"], len(order)))
    results = pd.DataFrame.from_records(rows, columns=list(COLUMNS))
    tmp = path.with_name(f".{path.name}.tmp")
    results.to_parquet(tmp, index=False)
    os.replace(tmp, path)
    return results
