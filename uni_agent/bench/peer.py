"""The same workload on mini-swe-agent's batch runner, for a side-by-side figure.

We call mini-swe-agent 2.4.6's own SWE-bench batch entry point (`minisweagent.run.benchmarks.swebench.main`, what
`mini-extra swebench` runs) in a subprocess, unchanged: its ThreadPoolExecutor of `--workers` threads, its
`process_instance` (model + environment + ProgressTrackingAgent per instance, trajectory and preds.json written per
instance), its rich progress display. What we choose through its own config mechanism (`-c key=value` specs over its
`benchmarks/swebench.yaml`):
- the dataset: a local JSON-lines file of `rollouts` instances with a problem statement (no SWE-bench download),
- `environment.environment_class=local` (its LocalEnvironment: each command a `subprocess` with `shell=True` in a
  shared working directory; no isolation, no per-instance start; the issue asks for "its local environment"),
- the model: its default LitellmModel (tool calls) with `openai/scripted` at our endpoint (`api_base`), cost
  tracking off (a scripted model has no price),
- `agent.step_limit` = turns + 2 (never reached: the endpoint submits after `turns` commands).
The endpoint answers it with a `bash` tool call of the same command, then `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
(its submit): the same number of LLM calls per rollout, and one more (trivial) command than uni-agent runs.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .lifetime import die_with_bench
from .measure import ideal_makespan, load_average

PEER_VERSION = "2.4.6"


def peer_available() -> str | None:
    """None when mini-swe-agent is installed, else why not."""
    try:
        version = importlib.metadata.version("mini-swe-agent")
    except importlib.metadata.PackageNotFoundError:
        return "mini-swe-agent is not installed (pip install -e '.[bench]')"
    if version != PEER_VERSION:
        return f"mini-swe-agent {version} is installed; the benchmark is written against {PEER_VERSION}"
    return None


def run_peer(base_url: str, *, concurrency: int, turns: int, delay_s: float, rollouts: int,
             out_dir: Path, timeout_s: float = 3600) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    data_dir = out_dir / "data"
    data_dir.mkdir(exist_ok=True)
    with open(data_dir / "train.jsonl", "w") as f:
        for i in range(rollouts):
            f.write(json.dumps({"instance_id": f"bench__task-{i}", "problem_statement": "Benchmark task: run the "
                                "commands you are given, then submit.", "repo": "bench/task", "base_commit": ""}) + "\n")
    work = out_dir / "work"
    work.mkdir(exist_ok=True)
    args = {"data_dir": str(data_dir), "output": str(out_dir / "output"), "workers": concurrency,
            "base_url": base_url, "cwd": str(work), "step_limit": turns + 2}
    load_before = load_average()
    env = {**os.environ, "MSWEA_COST_TRACKING": "ignore_errors", "MSWEA_SILENT_STARTUP": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "MSWEA_GLOBAL_CONFIG_DIR": str(out_dir / "mini-config")}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "uni_agent.bench.peer", json.dumps(args)], env=env,
                          capture_output=True, text=True, timeout=timeout_s, preexec_fn=die_with_bench())
    outer_wall = time.monotonic() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{\"bench\"")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"mini-swe-agent run failed (exit {proc.returncode}): {proc.stderr[-3000:]}")
    inner = json.loads(lines[-1])["bench"]
    makespan = inner["wall_s"]
    llm_calls = inner["llm_calls"]
    ideal = ideal_makespan(rollouts, concurrency, turns + 1, delay_s)
    return {
        "system": "mini-swe-agent", "workers": 1, "concurrency": concurrency, "rollouts": rollouts,
        "ok": inner["submitted"],
        # one trajectory file per instance: a rollout without one is lost; a second one cannot exist (no "dup")
        "recorded": inner["recorded"], "lost": rollouts - inner["recorded"], "duplicates": None,
        "makespan_s": makespan, "ideal_s": ideal, "efficiency": ideal / makespan,
        "rollouts_per_min": rollouts / makespan * 60, "llm_calls": llm_calls, "commands": inner["commands"],
        "framework_cpu_s": inner["cpu_own_s"],
        "framework_cpu_ms_per_turn": inner["cpu_own_s"] / max(1, llm_calls) * 1000,
        "sandbox_cpu_ms_per_turn": inner["cpu_children_s"] / max(1, llm_calls) * 1000,
        "sandbox_start_p50_ms": float("nan"), "sandbox_start_p95_ms": float("nan"),
        "peak_mib_per_rollout": inner["added_rss_bytes"] / 2**20 / concurrency,
        "load": max(load_before, load_average()), "startup_s": outer_wall - makespan,
        "errors": inner["errors"][:3],
    }


def _main(args: dict[str, Any]) -> None:
    """In the subprocess: import mini-swe-agent (litellm's import is slow: not timed), then time its batch run."""
    import contextlib
    import io

    from minisweagent.run.benchmarks import swebench

    from .measure import cpu_now, rss_bytes

    baseline_rss = rss_bytes(os.getpid())
    specs = [str(swebench.DEFAULT_CONFIG_FILE), "environment.environment_class=local", f"environment.cwd={args['cwd']}",
             "model.model_kwargs.api_base=" + args["base_url"], "model.model_kwargs.api_key=bench",
             "model.model_kwargs.drop_params=true", "model.cost_tracking=ignore_errors",
             # A request lost on the way (256 threads on 2 cores: the endpoint saw one closed before its reply) is
             # retried after 20 s (ten times a call here) rather than litellm's default 600: one had held a run back.
             "model.model_kwargs.timeout=20",
             f"agent.step_limit={args['step_limit']}"]
    before = cpu_now()
    started = time.monotonic()
    with contextlib.redirect_stdout(io.StringIO()):  # its live progress display
        swebench.main(subset=args["data_dir"], split="train", slice_spec="", filter_spec="", shuffle=False,
                      output=args["output"], workers=args["workers"], model="openai/scripted", model_class=None,
                      redo_existing=True, config_spec=specs, environment_class=None)
    wall = time.monotonic() - started
    used = cpu_now() - before
    import resource

    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    submitted, llm_calls, commands, errors = 0, 0, 0, set()
    trajectories = list(Path(args["output"]).glob("*/*.traj.json"))
    for traj in trajectories:
        data = json.loads(traj.read_text())
        info = data.get("info", {})
        submitted += info.get("exit_status") == "Submitted"
        llm_calls += int(info.get("model_stats", {}).get("api_calls", 0))
        commands += sum(m.get("role") == "tool" for m in data.get("messages", []))
        if info.get("exit_status") != "Submitted":
            errors.add(f"{info.get('exit_status')}: {str(info.get('exception_str', ''))[:200]}")
    print(json.dumps({"bench": {"wall_s": wall, "cpu_own_s": used.own, "cpu_children_s": used.children,
                                "added_rss_bytes": max(0, peak_rss - baseline_rss), "submitted": submitted,
                                "recorded": len(trajectories),
                                "llm_calls": llm_calls, "commands": commands, "errors": sorted(errors)}}), flush=True)


if __name__ == "__main__":
    _main(json.loads(sys.argv[1]))
