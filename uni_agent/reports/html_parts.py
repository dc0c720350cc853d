"""The HTML pieces of `uni-agent report` (uni_agent.reports.run_report): the page's head and style, the headline
tiles, the tables, the turns histogram (inline SVG), the time breakdown and the rendered trajectories. Each takes the
rows run_report prepared and returns HTML text; nothing here reads files."""

from __future__ import annotations

import html
import json
import math
import re
from typing import Any

import pandas as pd

from ..episode.exit_reason import ExitReason

TIMINGS = (("sandbox_start_s", "sandbox start"), ("llm_s", "LLM"), ("tools_s", "tools"), ("verify_s", "verification"),
           ("total_s", "episode total"))
COLORS = {"sandbox start": "#bf8700", "LLM": "#0969da", "tools": "#1a7f37", "other": "#8c959f",
          "verification": "#8250df"}
MAX_CONTENT_CHARS = 6000  # per message in the report; the full text is in results/


def escape(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def anchor(instance_id: str, rollout: int) -> str:
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
    label = escape(text if text is not None else f"{row['instance_id']} #{int(row['rollout'])}")
    anchor = anchors.get((row["instance_id"], int(row["rollout"])))
    return f"<a href='#{anchor}'>{label}</a>" if anchor else label


def headline(df, avg, lo, hi, n, n_values, pass_k, summary) -> str:
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
        f"<div class='tile' id='tile-{i}'><div class='label'>{escape(label)}</div><div class='value' id='{i}'>{value}"
        f"</div>{sub}</div>" for i, label, value, sub in tiles) + "</div>"


def tasks_table(df: pd.DataFrame, anchors) -> str:
    rows = []
    for instance_id, group in df.groupby("instance_id", sort=True):
        marks = "".join(
            f"<a class='mark {'ok' if r['reward'] >= 1 else 'bad'}' title='#{int(r['rollout'])}: reward "
            f"{r['reward']:g}, {escape(r['exit_reason'])}' "
            + (f"href='#{anchors[(instance_id, int(r['rollout']))]}'" if (instance_id, int(r["rollout"])) in anchors
               else "") + "></a>"
            for _, r in group.iterrows())
        mean = group["reward"].mean()
        rows.append(
            f"<tr><td>{escape(instance_id)}</td><td class='num'>{len(group)}</td><td class='num'>{_fmt(mean)}</td>"
            f"<td><span class='meter'><i style='width:{100 * mean:.1f}%'></i></span></td><td>{marks}</td>"
            f"<td class='num'>{group['num_turns'].mean():.1f}</td><td class='num'>{_dur(group['wall_s'].mean())}</td>"
            f"<td>{escape(', '.join(f'{k} {v}' for k, v in group['exit_reason'].value_counts().items()))}</td></tr>")
    return ("<table id='task-table'><thead><tr><th>instance</th><th class='num'>rollouts</th><th class='num'>mean "
            "reward</th><th></th><th>rollouts (click: trajectory)</th><th class='num'>mean turns</th>"
            "<th class='num'>mean time</th><th>exit reasons</th></tr></thead><tbody>" + "".join(rows)
            + "</tbody></table>")


def turns_svg(turns: pd.Series) -> str:
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


def exit_reasons_table(df: pd.DataFrame) -> str:
    counts = df["exit_reason"].value_counts()
    total = int(counts.sum())
    rows = "".join(
        f"<tr><td>{escape(reason)}</td><td class='num'>{int(c)}</td><td class='num'>{100 * c / total:.0f}%</td>"
        f"<td><span class='meter'><i style='width:{100 * c / total:.1f}%'></i></span></td>"
        f"<td class='num'>{_fmt(df.loc[df['exit_reason'] == reason, 'reward'].mean())}</td></tr>"
        for reason, c in counts.items())
    return ("<table id='exit-table'><thead><tr><th>exit reason</th><th class='num'>rollouts</th><th class='num'>"
            "share</th><th></th><th class='num'>mean reward</th></tr></thead><tbody>" + rows + "</tbody></table>")


def time_breakdown(df: pd.DataFrame) -> str:
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


def rollout_table(rows: pd.DataFrame, anchors, *, with_error: bool, table_id: str) -> str:
    body = []
    for _, r in rows.iterrows():
        error = (f"<td>{escape(r['failure_kind'])}</td><td class='wrap'>{escape((r['error'] or '')[:300])}</td>"
                 if with_error else "")
        body.append(f"<tr><td>{_rollout_link(r, anchors)}</td><td class='num'>{r['reward']:g}</td>"
                    f"<td>{escape(r['exit_reason'])}</td><td class='num'>{int(r['num_turns'])}</td>"
                    f"<td class='num'>{_dur(r['total_s'])}</td><td class='num'>{_dur(r['verify_s'])}</td>"
                    f"<td>{escape(r['worker'])}</td>{error}</tr>")
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


def trajectory(row: Any, anchor: str) -> str:
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
            head = " · ".join(escape(x) for x in (f"{i}. {role}", m.get("name"), m.get("tool_call_id")) if x)
            calls = "".join(
                f"<div class='call'><b>tool call: {escape((c.get('function') or {}).get('name'))}</b>"
                f"<pre>{escape(_clip(_pretty((c.get('function') or {}).get('arguments'))))}</pre></div>"
                for c in m.get("tool_calls") or [] if isinstance(c, dict))
            text = f"<pre>{escape(_clip(str(content)))}</pre>" if content not in (None, "") else ""
            blocks.append(f"<div class='msg role-{escape(role)}'><div class='role'>{head}</div>{text}{calls}</div>")
    else:
        blocks.append(f"<pre>{escape(_clip(str(row['messages'])))}</pre>")
    verification = _verification(row["verification"])
    patch = f"<h4>patch</h4><pre class='patch'>{escape(_clip(row['patch']))}</pre>" if row["patch"] else \
        "<p class='note'>empty patch</p>"
    summary = (f"{escape(row['instance_id'])} #{int(row['rollout'])} · reward {row['reward']:g} · "
               f"{escape(row['exit_reason'])} · {int(row['num_turns'])} turns · {_dur(row['total_s'])}")
    error = f"<p class='error'>{escape(row['error'])}</p>" if row["error"] else ""
    return (f"<details class='trajectory' id='{anchor}'><summary>{summary}</summary>{error}{verification}{patch}"
            f"<h4>messages</h4>{''.join(blocks)}</details>")


def _verification(text: str) -> str:
    try:
        v = json.loads(text or "{}")
    except json.JSONDecodeError:
        return f"<pre>{escape(text)}</pre>"
    if not v:
        return "<p class='note'>not verified</p>"
    tests = "".join(
        f"<tr><td>{name}</td><td class='wrap'>{escape(test)}</td><td>{escape(status)}</td></tr>"
        for name in ("fail_to_pass", "pass_to_pass") for test, status in (v.get(name) or {}).items())
    log_tail = (f"<details><summary>test log (tail)</summary><pre>{escape(_clip(v.get('log_tail') or ''))}</pre>"
                "</details>")
    return (f"<p class='verification'>verification: <b>{escape(v.get('status'))}</b> · patch applied "
            f"{escape(v.get('patch_applied'))} · {_dur(v.get('seconds') or 0)}"
            + (f" · {escape(v.get('error'))}" if v.get("error") else "") + "</p>"
            + (f"<table class='tests'>{tests}</table>" if tests else "") + log_tail)


def _pretty(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, indent=2, ensure_ascii=False)


def page_head(title: str) -> str:
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>
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


PAGE_FOOT = """<script>
// Following a link to a trajectory opens it (and the browser scrolls to it).
function openTarget() {
  const target = location.hash && document.getElementById(decodeURIComponent(location.hash.slice(1)));
  if (target && target.tagName === "DETAILS") { target.open = true; target.scrollIntoView({block: "start"}); }
}
window.addEventListener("hashchange", openTarget);
openTarget();
</script></body></html>
"""
