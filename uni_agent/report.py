"""`uni-agent report OUTPUT_DIR`: one self-contained HTML file from a run's Parquet results.

Reward per task, Avg@N with a bootstrap confidence interval over tasks and the infrastructure failures counted
apart (an outage is not a model result), pass@k, a turns histogram (inline SVG), exit
reasons, the time breakdown, and the slowest and failing rollouts linked to their trajectories, which are rendered
in the same file. No scripts or styles from elsewhere: the file opens offline and can be mailed around.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .config import ConfigError
from .exit_reason import ExitReason
from .results import ResultStore, migrate_rows
from .summary import pass_at_k

TIMINGS = (("sandbox_start_s", "sandbox start"), ("llm_s", "LLM"), ("tools_s", "tools"), ("verify_s", "verification"),
           ("total_s", "episode total"))
COLORS = {"sandbox start": "#bf8700", "LLM": "#0969da", "tools": "#1a7f37", "other": "#8c959f",
          "verification": "#8250df"}
MAX_CONTENT_CHARS = 6000  # per message in the report; the full text is in results/


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
    df = migrate_rows(frame.copy())  # rows of older versions under today's exit-reason names
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
    anchors = {key: _anchor(*key) for key in shown}

    per_task = df.groupby("instance_id")["reward"]
    task_means = per_task.mean()
    avg, lo, hi = _avg_at_n(task_means.to_numpy())
    n_values = df.groupby("instance_id").size()
    n = int(n_values.max())
    ks = sorted({k for k in (1, 2, 4, 8, 16, 32, 64, n) if k <= n})
    pass_k = {k: float(np.mean([pass_at_k(len(g), int((g >= 1).sum()), k) for _, g in per_task if len(g) >= k]))
              for k in ks}

    parts = [
        _head(f"uni-agent report · {title}"),
        f"<h1>uni-agent report</h1><p class='note'>{_e(title)} · run {_e(summary.get('run_id', '?'))} · written "
        f"{_e(time.strftime('%Y-%m-%d %H:%M'))} · {len(df)} rollouts of {len(task_means)} tasks</p>",
        _headline(df, avg, lo, hi, n, n_values, pass_k, summary),
        "<h2 id='tasks'>Reward per task</h2>", _tasks_table(df, anchors),
        "<div class='cols'><div><h2 id='turns'>Turns per rollout</h2>", _turns_svg(df["num_turns"].astype(int)),
        "</div><div><h2 id='exit-reasons'>Exit reasons</h2>", _exit_reasons(df), "</div></div>",
        "<h2 id='time'>Where the time goes</h2>", _time_breakdown(df),
        "<h2 id='slowest'>Slowest rollouts</h2>",
        _rollout_table(slow_rows, anchors, with_error=False, table_id="slowest-table"),
        "<h2 id='failing'>Failing rollouts</h2>",
        "<p class='note'>Rollouts that ended in an error or carry an error message (infrastructure failures first)."
        "</p>",
        _rollout_table(failing_rows, anchors, with_error=True, table_id="failing-table") if len(failing_rows) else
        "<p class='empty'>No rollout failed.</p>",
        f"<h2 id='trajectories'>Trajectories ({len(shown)} of {len(df)})</h2>",
        "<p class='note'>The linked rollouts, each message clipped to "
        f"{MAX_CONTENT_CHARS:,} characters; every full trajectory is in results/ (column <code>messages</code>).</p>",
        *(_trajectory(df.loc[i], anchors[key]) for key, i in shown.items()),
        _FOOT,
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


# -- HTML pieces -------------------------------------------------------------------------------------------------


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _anchor(instance_id: str, rollout: int) -> str:
    return f"traj-{re.sub(r'[^A-Za-z0-9_.-]', '_', instance_id)}-r{rollout}"


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}f}"


def _dur(seconds: Any) -> str:
    if seconds is None or not math.isfinite(float(seconds)):
        return "–"
    s = float(seconds)
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 90:
        return f"{s:.1f} s"
    return f"{s / 60:.1f} min" if s < 5400 else f"{s / 3600:.1f} h"


def _rollout_link(row: Any, anchors: dict[tuple[str, int], str], text: str | None = None) -> str:
    label = _e(text if text is not None else f"{row['instance_id']} #{int(row['rollout'])}")
    anchor = anchors.get((row["instance_id"], int(row["rollout"])))
    return f"<a href='#{anchor}'>{label}</a>" if anchor else label


def _headline(df, avg, lo, hi, n, n_values, pass_k, summary) -> str:
    ci = f"95% CI {_fmt(lo)}–{_fmt(hi)}" if lo is not None else "one task: no interval"
    infra = df["failure_kind"] == "infra"
    uneven = "" if n_values.nunique() == 1 else (
        f"<div class='sub'>tasks have {n_values.min()}–{n_values.max()} rollouts; mean over rollouts "
        f"{_fmt(df['reward'].mean())}</div>")
    tiles = [
        ("avg-at-n", f"Avg@{n}", _fmt(avg), f"<div class='sub'>{ci} (bootstrap over tasks)</div>{uneven}"),
        *((f"pass-at-{k}", f"pass@{k}", _fmt(v), "") for k, v in pass_k.items()),
        ("resolved", "rollouts resolved", f"{int((df['reward'] >= 1).sum())} / {len(df)}",
         f"<div class='sub'>{int((df.groupby('instance_id')['reward'].max() >= 1).sum())} of "
         f"{df['instance_id'].nunique()} tasks at least once</div>"),
        ("errors", "errors", str(int((df["exit_reason"] == ExitReason.ERROR).sum())),
         f"<div class='sub'>{int(df['error'].notna().sum())} rollouts with an error message</div>"),
        ("infra-failures", "infrastructure failures", str(int(infra.sum())),
         f"<div class='sub'>not model results; Avg@{n} without them "
         f"{_fmt(df.loc[~infra, 'reward'].mean()) if (~infra).any() else '-'}</div>"),
    ]
    if summary.get("wall_seconds"):
        tiles.append(("wall", "wall clock", _dur(summary["wall_seconds"]),
                      f"<div class='sub'>{_fmt(summary.get('rollouts_per_minute'), 1)} rollouts/min</div>"))
    return "<div class='tiles'>" + "".join(
        f"<div class='tile' id='tile-{i}'><div class='label'>{_e(label)}</div><div class='value' id='{i}'>{value}"
        f"</div>{sub}</div>" for i, label, value, sub in tiles) + "</div>"


def _tasks_table(df: pd.DataFrame, anchors) -> str:
    rows = []
    for instance_id, group in df.groupby("instance_id", sort=True):
        marks = "".join(
            f"<a class='mark {'ok' if r['reward'] >= 1 else 'bad'}' title='#{int(r['rollout'])}: reward "
            f"{r['reward']:g}, {_e(r['exit_reason'])}' "
            + (f"href='#{anchors[(instance_id, int(r['rollout']))]}'" if (instance_id, int(r["rollout"])) in anchors
               else "") + "></a>"
            for _, r in group.iterrows())
        mean = group["reward"].mean()
        rows.append(
            f"<tr><td>{_e(instance_id)}</td><td class='num'>{len(group)}</td><td class='num'>{_fmt(mean)}</td>"
            f"<td><span class='meter'><i style='width:{100 * mean:.1f}%'></i></span></td><td>{marks}</td>"
            f"<td class='num'>{group['num_turns'].mean():.1f}</td><td class='num'>{_dur(group['wall_s'].mean())}</td>"
            f"<td>{_e(', '.join(f'{k} {v}' for k, v in group['exit_reason'].value_counts().items()))}</td></tr>")
    return ("<table id='task-table'><thead><tr><th>instance</th><th class='num'>rollouts</th><th class='num'>mean "
            "reward</th><th></th><th>rollouts (click: trajectory)</th><th class='num'>mean turns</th>"
            "<th class='num'>mean time</th><th>exit reasons</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def _turns_svg(turns: pd.Series) -> str:
    counts = turns.value_counts().sort_index()
    top = int(turns.max()) if len(turns) else 0
    bins = list(range(0, top + 1))
    values = [int(counts.get(b, 0)) for b in bins]
    peak = max(values) or 1
    width, height, left, bottom = 560, 200, 34, 26
    bar_w = (width - left - 8) / max(1, len(bins))
    plot_h = height - bottom - 12
    bars, labels = [], []
    for i, (b, v) in enumerate(zip(bins, values, strict=True)):
        x = left + i * bar_w
        h = plot_h * v / peak
        bars.append(f"<rect class='bar' data-turns='{b}' data-count='{v}' x='{x + 1:.1f}' y='{12 + plot_h - h:.1f}' "
                    f"width='{max(1.0, bar_w - 2):.1f}' height='{h:.1f}'><title>{b} turns: {v} rollouts</title></rect>")
        if len(bins) <= 30 or b % max(1, len(bins) // 15) == 0:
            labels.append(f"<text x='{x + bar_w / 2:.1f}' y='{height - 8}' text-anchor='middle'>{b}</text>")
        if v:
            labels.append(f"<text x='{x + bar_w / 2:.1f}' y='{12 + plot_h - h - 3:.1f}' text-anchor='middle' "
                          f"class='count'>{v}</text>")
    axis = (f"<line x1='{left}' y1='{12 + plot_h}' x2='{width - 4}' y2='{12 + plot_h}' stroke='#8c959f'/>"
            f"<text transform='rotate(-90)' x='{-(12 + plot_h / 2):.0f}' y='14' text-anchor='middle'>rollouts</text>")
    return (f"<svg id='turns-histogram' viewBox='0 0 {width} {height}' width='{width}' height='{height}' "
            f"role='img' aria-label='turns histogram'>{axis}{''.join(bars)}{''.join(labels)}</svg>"
            "<p class='note'>x: turns (LLM calls) per rollout</p>")


def _exit_reasons(df: pd.DataFrame) -> str:
    counts = df["exit_reason"].value_counts()
    total = int(counts.sum())
    rows = "".join(
        f"<tr><td>{_e(reason)}</td><td class='num'>{int(c)}</td><td class='num'>{100 * c / total:.0f}%</td>"
        f"<td><span class='meter'><i style='width:{100 * c / total:.1f}%'></i></span></td>"
        f"<td class='num'>{_fmt(df.loc[df['exit_reason'] == reason, 'reward'].mean())}</td></tr>"
        for reason, c in counts.items())
    return ("<table id='exit-table'><thead><tr><th>exit reason</th><th class='num'>rollouts</th><th class='num'>"
            "share</th><th></th><th class='num'>mean reward</th></tr></thead><tbody>" + rows + "</tbody></table>")


def _time_breakdown(df: pd.DataFrame) -> str:
    stats = []
    for col, label in TIMINGS:
        values = df[col].astype(float)
        stats.append(f"<tr><td>{label}</td><td class='num'>{_dur(values.mean())}</td>"
                     f"<td class='num'>{_dur(values.median())}</td><td class='num'>{_dur(values.quantile(0.95))}</td>"
                     f"<td class='num'>{_dur(values.max())}</td><td class='num'>{_dur(values.sum())}</td></tr>")
    means = {label: float(df[col].astype(float).mean()) for col, label in TIMINGS}
    other = max(0.0, means["episode total"] - means["sandbox start"] - means["LLM"] - means["tools"])
    parts = [("sandbox start", means["sandbox start"]), ("LLM", means["LLM"]), ("tools", means["tools"]),
             ("other", other), ("verification", means["verification"])]
    whole = sum(v for _, v in parts) or 1.0
    bar = "".join(f"<span style='width:{100 * v / whole:.2f}%;background:{COLORS[k]}' title='{k}: {_dur(v)}'></span>"
                  for k, v in parts)
    legend = " ".join(f"<span class='key'><i style='background:{COLORS[k]}'></i>{k} {100 * v / whole:.0f}% "
                      f"({_dur(v)})</span>" for k, v in parts)
    return (f"<div class='stack' id='time-bar'>{bar}</div><p class='note'>{legend}</p>"
            "<p class='note'>Mean time of one rollout. <em>other</em> is agent overhead inside the episode (parsing, "
            "collecting the patch, closing the sandbox); verification runs after the episode in a fresh sandbox.</p>"
            "<table id='time-table'><thead><tr><th></th><th class='num'>mean</th><th class='num'>p50</th>"
            "<th class='num'>p95</th><th class='num'>max</th><th class='num'>sum</th></tr></thead><tbody>"
            + "".join(stats) + "</tbody></table>")


def _rollout_table(rows: pd.DataFrame, anchors, *, with_error: bool, table_id: str) -> str:
    body = []
    for _, r in rows.iterrows():
        error = (f"<td>{_e(r['failure_kind'])}</td><td class='wrap'>{_e((r['error'] or '')[:300])}</td>"
                 if with_error else "")
        body.append(f"<tr><td>{_rollout_link(r, anchors)}</td><td class='num'>{r['reward']:g}</td>"
                    f"<td>{_e(r['exit_reason'])}</td><td class='num'>{int(r['num_turns'])}</td>"
                    f"<td class='num'>{_dur(r['total_s'])}</td><td class='num'>{_dur(r['verify_s'])}</td>"
                    f"<td>{_e(r['worker'])}</td>{error}</tr>")
    head = ("<tr><th>rollout</th><th class='num'>reward</th><th>exit</th><th class='num'>turns</th><th class='num'>"
            "episode</th><th class='num'>verify</th><th>worker</th>"
            + ("<th>failure</th><th>error</th>" if with_error else "") + "</tr>")
    return f"<table class='rollouts' id='{table_id}'><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"


def _clip(text: str) -> str:
    if len(text) <= MAX_CONTENT_CHARS:
        return text
    half = MAX_CONTENT_CHARS // 2
    clipped = f"[… {len(text) - MAX_CONTENT_CHARS:,} characters clipped in the report …]"
    return f"{text[:half]}\n\n{clipped}\n\n{text[-half:]}"


def _trajectory(row: Any, anchor: str) -> str:
    try:
        messages = json.loads(row["messages"] or "[]")
    except json.JSONDecodeError:
        messages = None
    blocks = []
    if isinstance(messages, list):
        for i, m in enumerate(messages):
            if not isinstance(m, dict):
                continue
            role = str(m.get("role", "?"))
            content = m.get("content")
            if isinstance(content, list):
                content = "\n".join(str(p.get("text", p)) if isinstance(p, dict) else str(p) for p in content)
            head = " · ".join(_e(x) for x in (f"{i}. {role}", m.get("name"), m.get("tool_call_id")) if x)
            calls = "".join(
                f"<div class='call'><b>tool call: {_e((c.get('function') or {}).get('name'))}</b>"
                f"<pre>{_e(_clip(_pretty((c.get('function') or {}).get('arguments'))))}</pre></div>"
                for c in m.get("tool_calls") or [] if isinstance(c, dict))
            text = f"<pre>{_e(_clip(str(content)))}</pre>" if content not in (None, "") else ""
            blocks.append(f"<div class='msg role-{_e(role)}'><div class='role'>{head}</div>{text}{calls}</div>")
    else:
        blocks.append(f"<pre>{_e(_clip(str(row['messages'])))}</pre>")
    verification = _verification(row["verification"])
    patch = f"<h4>patch</h4><pre class='patch'>{_e(_clip(row['patch']))}</pre>" if row["patch"] else \
        "<p class='note'>empty patch</p>"
    summary = (f"{_e(row['instance_id'])} #{int(row['rollout'])} · reward {row['reward']:g} · "
               f"{_e(row['exit_reason'])} · {int(row['num_turns'])} turns · {_dur(row['total_s'])}")
    error = f"<p class='error'>{_e(row['error'])}</p>" if row["error"] else ""
    return (f"<details class='trajectory' id='{anchor}'><summary>{summary}</summary>{error}{verification}{patch}"
            f"<h4>messages</h4>{''.join(blocks)}</details>")


def _verification(text: str) -> str:
    try:
        v = json.loads(text or "{}")
    except json.JSONDecodeError:
        return f"<pre>{_e(text)}</pre>"
    if not v:
        return "<p class='note'>not verified</p>"
    tests = "".join(
        f"<tr><td>{name}</td><td class='wrap'>{_e(test)}</td><td>{_e(status)}</td></tr>"
        for name in ("fail_to_pass", "pass_to_pass") for test, status in (v.get(name) or {}).items())
    log_tail = f"<details><summary>test log (tail)</summary><pre>{_e(_clip(v.get('log_tail') or ''))}</pre></details>"
    return (f"<p class='verification'>verification: <b>{_e(v.get('status'))}</b> · patch applied "
            f"{_e(v.get('patch_applied'))} · {_dur(v.get('seconds') or 0)}"
            + (f" · {_e(v.get('error'))}" if v.get("error") else "") + "</p>"
            + (f"<table class='tests'>{tests}</table>" if tests else "") + log_tail)


def _pretty(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _head(title: str) -> str:
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><style>
body {{ font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #1f2328;
       margin: 0 auto; padding: 16px 24px 60px; max-width: 1400px; }}
h1 {{ font-size: 22px; margin: 4px 0; }} h2 {{ font-size: 16px; margin: 26px 0 8px; }} h4 {{ margin: 10px 0 4px; }}
.note {{ color: #656d76; font-size: 12.5px; }} .empty {{ color: #656d76; font-style: italic; }}
.tiles {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(170px, 1fr)); gap: 10px;
          margin-top: 14px; }}
.tile {{ border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 12px; background: #f6f8fa; }}
.tile .label, .tile .sub {{ color: #656d76; font-size: 12px; }} .tile .value {{ font-size: 24px; font-weight: 600; }}
.cols {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(460px, 1fr)); gap: 0 32px; }}
table {{ border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }}
th, td {{ text-align: left; padding: 3px 8px; border-bottom: 1px solid #d0d7de; white-space: nowrap; }}
th {{ color: #656d76; font-weight: 500; font-size: 12px; }} .num {{ text-align: right; }}
td.wrap {{ white-space: normal; word-break: break-word; }}
.meter {{ display: inline-block; width: 90px; height: 8px; background: #eaeef2; border-radius: 4px; overflow: hidden;
         vertical-align: middle; }} .meter i {{ display: block; height: 100%; background: #1a7f37; }}
.mark {{ display: inline-block; width: 11px; height: 11px; margin-right: 2px; border-radius: 2px; }}
.mark.ok {{ background: #1a7f37; }} .mark.bad {{ background: #cf222e; }}
a.mark[href]:hover {{ outline: 2px solid #0969da; }}
svg text {{ font-size: 11px; fill: #656d76; }} svg .bar {{ fill: #0969da; }} svg .count {{ fill: #1f2328; }}
.stack {{ display: flex; height: 18px; border-radius: 4px; overflow: hidden; background: #eaeef2; }}
.key i {{ display: inline-block; width: 10px; height: 10px; margin: 0 4px 0 10px; border-radius: 2px; }}
details.trajectory {{ border: 1px solid #d0d7de; border-radius: 6px; margin: 8px 0; padding: 6px 12px; }}
details.trajectory > summary {{ cursor: pointer; font-weight: 600; }} details.trajectory:target {{ border-color: #0969da;
  box-shadow: 0 0 0 2px #0969da33; }}
.msg {{ border: 1px solid #d0d7de; border-radius: 6px; margin: 6px 0; }}
.msg .role {{ font-size: 12px; font-weight: 600; padding: 2px 10px; background: #f6f8fa;
             border-bottom: 1px solid #d0d7de; }}
.role-assistant .role {{ color: #0969da; }} .role-tool .role, .role-user .role {{ color: #1a7f37; }}
pre {{ margin: 0; padding: 6px 10px; white-space: pre-wrap; word-break: break-word; font-size: 12.5px;
      max-height: 30em;
      overflow: auto; }} .call {{ border-top: 1px dashed #d0d7de; }} .call b {{ display: block; padding: 4px 10px 0;
      font-size: 12px; }} .patch {{ background: #f6f8fa; }} .error {{ color: #cf222e; }}
</style></head><body>"""


_FOOT = """<script>
// Following a link to a trajectory opens it (and the browser scrolls to it).
function openTarget() {
  const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (target && target.tagName === "DETAILS") { target.open = true; target.scrollIntoView({block: "start"}); }
}
window.addEventListener("hashchange", openTarget);
openTarget();
</script></body></html>
"""
