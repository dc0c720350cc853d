"""The llama.cpp engine on a GPU worker and on the CPUs, side by side, on one GPU machine.

For each mode it starts a `dask scheduler`, one GPU worker (`--resources GPU=1`) and one sandbox worker, runs
`parallel_infer.py` over the bundled tasks x n against it (engine_device gpu or cpu, the same agent concurrency and
slots), samples the GPU's memory while it runs, stops the processes, and prints one table:

    python cluster/engine_compare.py --n 8 --concurrency 64 [--model-path M.gguf] [--modes gpu,cpu] [--out DIR]

Needs the CUDA and the CPU builds of llama-server (python -m uni_agent.engines.llama_build --variant cuda / cpu).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parent.parent
AGENT_CONFIG = REPO / "examples" / "agent_interaction" / "agent_config_local.yaml"


def gpu_memory_mib() -> int:
    """GPU memory in use on the machine (0 where there is no nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=30).stdout
    return sum(int(x) for x in out.split() if x.strip().isdigit())


class PeakSampler(threading.Thread):
    """The most GPU memory seen while a run goes (nvidia-smi once a second)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.peak, self.done = 0, threading.Event()

    def run(self) -> None:
        while not self.done.wait(1):
            try:
                self.peak = max(self.peak, gpu_memory_mib())
            except (OSError, subprocess.SubprocessError, ValueError):
                pass


def start(logs: Path, name: str, *args: str) -> subprocess.Popen:
    out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"})


def one_mode(mode: str, args: argparse.Namespace, out: Path) -> dict:
    work = out / mode
    logs = work / "processes"
    logs.mkdir(parents=True, exist_ok=True)
    sched_file = work / "scheduler.json"
    config = work / "agent_config.yaml"
    config.write_text(re.sub(r"concurrency: \d+", f"concurrency: {args.concurrency}", AGENT_CONFIG.read_text(), 1))
    from uni_agent.driver.tls import write_credentials

    tls = work / "tls"  # the cluster speaks TLS as the SLURM recipes' does
    write_credentials(tls)
    credentials = ["--tls-ca-file", str(tls / "ca.pem"), "--tls-cert", str(tls / "cert.pem"),
                   "--tls-key", str(tls / "key.pem")]
    procs = [start(logs, "scheduler", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                   "--dashboard-address", "127.0.0.1:0", "--protocol", "tls", *credentials,
                   "--scheduler-file", str(sched_file), "--preload", "uni_agent.scheduler_preload")]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no scheduler file after 60 s; see {logs / 'scheduler.log'}")
            time.sleep(0.2)
        common = ["--scheduler-file", str(sched_file), "--host", "127.0.0.1", "--no-dashboard", "--nworkers", "1",
                  *credentials]
        procs.append(start(logs, "gpu-worker", "distributed.cli.dask_worker", *common, "--name", "gpu-worker",
                           "--nthreads", "2", "--resources", "GPU=1"))
        procs.append(start(logs, "sandbox-worker", "distributed.cli.dask_worker", *common, "--name",
                           "sandbox-worker", "--nthreads", str(args.sandbox_threads),
                           "--resources", f"SANDBOX={args.concurrency}"))
        command = [sys.executable, str(REPO / "examples" / "agent_interaction" / "parallel_infer.py"),
                   "--scheduler-file", str(sched_file), "--engine", "llama_cpp", "--engine-device", mode,
                   "--n-gpus-per-node", "1", "--engine-parallel", str(args.concurrency), "--n", str(args.n),
                   "--max-tokens", str(args.max_tokens), "--agent-config-path", str(config),
                   "--output-dir", str(work / "run"), "--no-progress"]
        if args.model_path:
            command += ["--model-path", args.model_path]
        if args.max_samples:
            command += ["--max-samples", str(args.max_samples)]
        sampler = PeakSampler()
        idle = gpu_memory_mib()
        sampler.start()
        started = time.monotonic()
        partial = False
        with open(work / "driver.log", "wb") as driver_log:
            # Results are flushed in parts of 4, so a run stopped at --time-limit still counts what it finished.
            driver = subprocess.Popen(command, stdout=driver_log, stderr=subprocess.STDOUT, env={
                **os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}", "UNI_AGENT_FLUSH_EVERY": "4",
                "UNI_AGENT_TLS_DIR": str(tls)})
            try:
                code = driver.wait(args.time_limit or None)
            except subprocess.TimeoutExpired:
                partial = True
                driver.send_signal(signal.SIGINT)
                try:
                    code = driver.wait(30)
                except subprocess.TimeoutExpired:
                    driver.kill()
                    code = driver.wait()
        wall = time.monotonic() - started
        sampler.done.set()
        results_dir = work / "run" / "results"
        if (code != 0 and not partial) or not results_dir.exists():
            tail = (work / "driver.log").read_text(errors="replace")[-3000:]
            return {"mode": mode, "error": f"parallel_infer exited {code}", "log_tail": tail}
        results = pd.read_parquet(results_dir)
        if results.empty:
            return {"mode": mode, "rollouts": 0, "partial": partial, "command_s": round(wall, 1)}
        summary_file = work / "run" / "summary.json"
        summary = json.loads(summary_file.read_text()) if not partial and summary_file.exists() else {}
        run_s = summary.get("wall_seconds") or wall
        return {
            "mode": mode, "rollouts": len(results), "partial": partial, "command_s": round(wall, 1),
            "run_s": round(run_s, 1), "rollouts_per_min": round(len(results) / run_s * 60, 2),
            "completion_tokens": int(results.completion_tokens.sum()),
            "tokens_per_s": round(float(results.completion_tokens.sum()) / run_s, 1),
            "llm_s_per_turn": round(float(results.llm_s.sum() / max(1, results.num_turns.sum())), 2),
            "gpu_mem_peak_mib": sampler.peak, "gpu_mem_idle_mib": idle,
            "exit_reasons": results.exit_reason.value_counts().to_dict(), "errors": int(results.error.notna().sum()),
        }
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64, help="agent concurrency = engine slots")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-samples", type=int, default=0)
    parser.add_argument("--sandbox-threads", type=int, default=8)
    parser.add_argument("--time-limit", type=float, default=0, help="stop a mode's run after this many seconds "
                        "and count the rollouts it finished (0: no limit)")
    parser.add_argument("--model-path", default=None)
    parser.add_argument("--modes", default="gpu,cpu")
    parser.add_argument("--out", type=Path, default=Path("outputs/engine-compare"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.modes.split(","):
        row = one_mode(mode, args, args.out)
        rows.append(row)
        print(json.dumps(row), flush=True)
    (args.out / "compare.json").write_text(json.dumps(rows, indent=2))
    keys = ["mode", "rollouts", "run_s", "rollouts_per_min", "tokens_per_s", "llm_s_per_turn", "gpu_mem_peak_mib"]
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(str(row.get(k, row.get("error", ""))) for k in keys))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
