"""`uni-agent report OUTPUT_DIR`: one self-contained HTML file from a run's Parquet results.

Reward per task, Avg@N with a bootstrap confidence interval over tasks and the infrastructure failures counted
apart (an outage is not a model result), pass@k, a turns histogram (inline SVG), exit
reasons, the time breakdown, and the slowest and failing rollouts linked to their trajectories, which are rendered
in the same file. No scripts or styles from elsewhere: the file opens offline and can be mailed around.

This module reads the results and works out the numbers; html_parts.py writes the HTML pieces.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..config import ConfigError
from ..episode.exit_reason import ExitReason
from .html_parts import (
    MAX_CONTENT_CHARS,
    PAGE_FOOT,
    anchor,
    escape,
    exit_reasons_table,
    headline,
    page_head,
    rollout_table,
    tasks_table,
    time_breakdown,
    trajectory,
    turns_svg,
)
from ..driver.results import ResultStore
from ..driver.summary import pass_at_k

def write_report(output_dir: str | Path, out: str | Path | None = None, *, max_trajectories: int = 150,
                 slowest: int = 10, failing: int = 50) -> Path:
    """Write the report (default OUTPUT_DIR/report.html) and return its path."""
    output_dir = Path(output_dir)
    if not (output_dir / "results").is_dir():  # checked first: ResultStore would create it
        raise ConfigError(f"{output_dir}: no results/ directory (is this a run's --output-dir?)")
    frame = ResultStore(output_dir).read()
    if frame.empty:
        raise ConfigError(f"{output_dir / 'results'}: no results yet")
    summary = _read_json(output_dir / "summary.json")
    path = Path(out) if out else output_dir / "report.html"
    path.write_text(render_report(frame, summary, title=str(output_dir), max_trajectories=max_trajectories,
                                  slowest=slowest, failing=failing), encoding="utf-8")
    return path


def render_report(frame: pd.DataFrame, summary: dict[str, Any] | None = None, *, title: str = "run",
                  max_trajectories: int = 150, slowest: int = 10, failing: int = 50) -> str:
    df = frame.copy()
    for col in ("messages", "patch", "verification", "worker", "exit_reason"):
        df[col] = df[col].fillna("").astype(object)
    df["error"] = df["error"].astype(object).where(df["error"].notna(), None)  # pandas' str dtype gives NaN
    df["failure_kind"] = _failure_kinds(df)
    df["rollout"] = df["rollout"].astype(int)
    df["reward"] = df["reward"].astype(float)
    df["wall_s"] = df["total_s"].astype(float) + df["verify_s"].astype(float)
    df = df.sort_values(["instance_id", "rollout"]).reset_index(drop=True)
    summary = summary or {}
    failing_rows = df[(df["exit_reason"] == ExitReason.ERROR) | df["error"].notna()]
    failing_rows = failing_rows.assign(_err=failing_rows["failure_kind"] == "infra").sort_values(
        ["_err", "instance_id", "rollout"], ascending=[False, True, True]).head(failing)
    slow_rows = df.sort_values("wall_s", ascending=False).head(slowest)
    shown = _pick_trajectories(df, slow_rows, failing_rows, max_trajectories)
    anchors = {key: anchor(*key) for key in shown}

    per_task = df.groupby("instance_id")["reward"]
    task_means = per_task.mean()
    avg, lo, hi = _avg_at_n(task_means.to_numpy())
    n_values = df.groupby("instance_id").size()
    n = int(n_values.max())
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, n) if k <= n})
    pass_k = {k: float(np.mean([pass_at_k(len(g), int((g >= 1).sum()), k) for _, g in per_task if len(g) >= k]))
              for k in ks}

    parts = [
        page_head(f"uni-agent report · {title}"),
        f"<h1>uni-agent report</h1><p class='note'>{escape(title)} · run {escape(summary.get('run_id', '?'))} · "
        "written "
        f"{escape(time.strftime('%Y-%m-%d %H:%M'))} · {len(df)} rollouts of {len(task_means)} tasks</p>",
        headline(df, avg, lo, hi, n, n_values, pass_k, summary),
        "<h2 id='tasks'>Reward per task</h2>", tasks_table(df, anchors),
        "<div class='cols'><div><h2 id='turns'>Turns per rollout</h2>", turns_svg(df["num_turns"].astype(int)),
        "</div><div><h2 id='exit-reasons'>Exit reasons</h2>", exit_reasons_table(df), "</div></div>",
        "<h2 id='time'>Where the time goes</h2>", time_breakdown(df),
        "<h2 id='slowest'>Slowest rollouts</h2>",
        rollout_table(slow_rows, anchors, with_error=False, table_id="slowest-table"),
        "<h2 id='failing'>Failing rollouts</h2>",
        "<p class='note'>Rollouts that ended in an error or carry an error message (infrastructure failures first)."
        "</p>",
        rollout_table(failing_rows, anchors, with_error=True, table_id="failing-table") if len(failing_rows) else
        "<p class='empty'>No rollout failed.</p>",
        f"<h2 id='trajectories'>Trajectories ({len(shown)} of {len(df)})</h2>",
        "<p class='note'>The linked rollouts, each message clipped to "
        f"{MAX_CONTENT_CHARS:,} characters; every full trajectory is in results/ (column <code>messages</code>).</p>",
        *(trajectory(df.loc[i], anchors[key]) for key, i in shown.items()),
        PAGE_FOOT,
    ]
    return "".join(parts)


# -- numbers -----------------------------------------------------------------------------------------------------


def _avg_at_n(task_means: np.ndarray, resamples: int = 4000, seed: int = 0) -> tuple[float, float | None, float | None]:
    """Avg@N (mean over tasks of each task's mean reward) and a 95% percentile-bootstrap interval over tasks: the
    tasks are the sample, the N rollouts of a task are not independent draws."""
    avg = float(task_means.mean())
    if len(task_means) < 2:
        return avg, None, None
    rng = np.random.default_rng(seed)
    boots = []
    for start in range(0, resamples, 500):  # chunks keep memory flat for many tasks
        size = min(500, resamples - start)
        boots.append(task_means[rng.integers(0, len(task_means), size=(size, len(task_means)))].mean(axis=1))
    lo, hi = np.quantile(np.concatenate(boots), [0.025, 0.975])
    return avg, float(lo), float(hi)


def _pick_trajectories(df: pd.DataFrame, slow: pd.DataFrame, failing: pd.DataFrame, limit: int
                       ) -> dict[tuple[str, int], int]:
    """Which rollouts get their trajectory in the file: failing, slowest, then one resolved and one unresolved
    rollout per task, then the rest, up to `limit`."""
    chosen: dict[tuple[str, int], int] = {}

    def take(indexes: Any) -> None:
        for i in indexes:
            if len(chosen) >= limit:
                return
            chosen.setdefault((df.at[i, "instance_id"], int(df.at[i, "rollout"])), i)

    take(failing.index)
    take(slow.index)
    for _, group in df.groupby("instance_id"):
        take(group.index[group["reward"] >= 1][:1])
        take(group.index[group["reward"] < 1][:1])
    take(df.index)
    return chosen


def _failure_kinds(df: pd.DataFrame) -> pd.Series:
    """Each row's failure_kind; rows written before the column existed get it from exit reason and reward."""
    inferred = pd.Series("model", index=df.index, dtype=object)
    inferred[df["reward"] >= 1] = "none"
    inferred[df["exit_reason"] == ExitReason.ERROR] = "infra"
    if "failure_kind" not in df:
        return inferred
    return df["failure_kind"].astype(object).where(df["failure_kind"].notna(), inferred)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
