"""A run's results → `preds.jsonl` for the official harness, and our grades in the official report's shape.

    uni-agent export-preds outputs/run1 --model-name my-model

writes, next to the run's `summary.json`:
- `preds.jsonl`: one `{"instance_id", "model_name_or_path", "model_patch"}` per instance (one rollout: `--rollout`,
  default 0), the input of `python -m swebench.harness.run_evaluation --predictions_path preds.jsonl`;
- `<model>.<run_id>.json`: our verification of those patches in the shape of the harness's final report
  (swebench 4.1.0 `make_run_report`, schema_version 2), so the two can be compared key by key.

How our verification statuses map onto the harness's categories (as its `run_instance` / `make_run_report` do):
empty patch → empty_patch (not evaluated); graded (resolved / unresolved) → completed, then resolved or unresolved;
patch that does not apply, timeout, error, or no verification → error (the harness writes no report.json for
those); an instance of the run without this rollout → incomplete.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import ConfigError

COMPLETED_STATUSES = ("resolved", "unresolved")


def _read_results(output_dir: Path) -> pd.DataFrame:
    from ..driver.results import RESULT_SCHEMA

    results_dir = output_dir / "results"
    files = sorted(results_dir.glob("part-*.parquet")) if results_dir.is_dir() else []
    if not files:
        raise ConfigError(f"{output_dir}: no results (expected {results_dir}/part-*.parquet from a run)")
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = ["run_id", "instance_id", "rollout", "patch", "resolved", "verification"]
    return pa.concat_tables(pq.read_table(f, columns=columns, schema=RESULT_SCHEMA) for f in files).to_pandas()


def _status(verification: Any) -> str | None:
    try:
        return json.loads(verification or "{}").get("status")
    except (TypeError, json.JSONDecodeError):
        return None


def model_file_name(model_name: str, run_id: str) -> str:
    """The harness's report file name: `<model with / as __>.<run_id>.json`."""
    return f"{model_name.replace('/', '__')}.{run_id}.json"


def make_report(instance_ids: list[str], predictions: dict[str, dict[str, Any]], statuses: dict[str, str | None],
                resolved: dict[str, bool]) -> dict[str, Any]:
    """The official final report's fields, from the run's instances and our verification of each prediction."""
    completed, resolved_ids, unresolved, errors, empty, incomplete = set(), set(), set(), set(), set(), set()
    for instance_id in instance_ids:
        prediction = predictions.get(instance_id)
        if prediction is None:
            incomplete.add(instance_id)
        elif prediction.get("model_patch") in ("", None):
            empty.add(instance_id)
        elif statuses.get(instance_id) in COMPLETED_STATUSES:
            completed.add(instance_id)
            (resolved_ids if resolved.get(instance_id) else unresolved).add(instance_id)
        else:
            errors.add(instance_id)
    return {
        "total_instances": len(instance_ids),
        "submitted_instances": len(predictions),
        "completed_instances": len(completed),
        "resolved_instances": len(resolved_ids),
        "unresolved_instances": len(unresolved),
        "empty_patch_instances": len(empty),
        "error_instances": len(errors),
        "completed_ids": sorted(completed),
        "incomplete_ids": sorted(incomplete),
        "empty_patch_ids": sorted(empty),
        "submitted_ids": sorted(predictions),
        "resolved_ids": sorted(resolved_ids),
        "unresolved_ids": sorted(unresolved),
        "error_ids": sorted(errors),
        "schema_version": 2,
        # make_run_report (4.1.0) adds these three whenever it is not given a Docker client; no containers here.
        "unstopped_instances": 0,
        "unstopped_containers": [],
        "unremoved_images": [],
    }


def export_predictions(output_dir: str | Path, model_name: str | None = None, rollout: int = 0
                       ) -> tuple[Path, Path, dict[str, Any]]:
    """Write preds.jsonl and the official-shaped report into `output_dir`; returns (preds path, report path, report)."""
    output_dir = Path(output_dir).expanduser()
    results = _read_results(output_dir)
    run_id = _run_id(output_dir, results)
    model_name = model_name or _model_name(output_dir)
    instance_ids = sorted(set(results["instance_id"]))
    chosen = results[results["rollout"].astype(int) == rollout].drop_duplicates("instance_id", keep="last")
    if chosen.empty:
        raise ConfigError(f"{output_dir}: no results for rollout {rollout} "
                          f"(rollouts present: {sorted(set(results['rollout'].astype(int)))})")
    chosen = chosen.sort_values("instance_id")
    predictions = {
        row.instance_id: {"instance_id": row.instance_id, "model_name_or_path": model_name,
                          "model_patch": row.patch or ""}
        for row in chosen.itertuples()
    }
    statuses = {row.instance_id: _status(row.verification) for row in chosen.itertuples()}
    resolved = {row.instance_id: bool(row.resolved) for row in chosen.itertuples()}
    report = make_report(instance_ids, predictions, statuses, resolved)
    preds_path = output_dir / "preds.jsonl"
    preds_path.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions.values()))
    report_path = output_dir / model_file_name(model_name, run_id)
    report_path.write_text(json.dumps(report, indent=4) + "\n")
    return preds_path, report_path, report


def _run_id(output_dir: Path, results: pd.DataFrame) -> str:
    marker = output_dir / "run.json"
    if marker.exists():
        return json.loads(marker.read_text())["run_id"]
    run_ids = sorted(set(results["run_id"].dropna()))
    return run_ids[-1] if run_ids else "uni-agent"


def _model_name(output_dir: Path) -> str:
    """The served model's name when the run recorded it in summary.json, else `uni-agent`."""
    summary = output_dir / "summary.json"
    try:
        data = json.loads(summary.read_text())
    except (OSError, json.JSONDecodeError):
        return "uni-agent"
    return str(data.get("model_name") or data.get("model") or "uni-agent")
