"""A Dask cluster on one GPU machine for the RL example: a TLS scheduler, one GPU worker (the engines' llama-servers)
and one sandbox worker (agents and sandboxes), as processes, as cluster/engine_compare.py starts them.

    with gpu_cluster(Path("outputs/rl/cluster"), sandbox_workers=4) as (scheduler_file, tls_dir):
        service = await RolloutService.start(..., scheduler_file=str(scheduler_file), tls_dir=str(tls_dir),
                                             engine_device="gpu", n_gpus_per_node=1)

(A run's own LocalCluster has no GPU worker for llama.cpp: its engines would run on the CPUs.)
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def gpu_cluster(work: Path, *, sandbox_workers: int = 4, sandbox_threads: int = 3, sandboxes: int = 256,
                gpus: int = 1) -> Iterator[tuple[Path, Path]]:
    """(scheduler file, TLS credentials dir) of a cluster that lives as long as the block."""
    from uni_agent.driver.tls import write_credentials

    logs = work / "processes"
    logs.mkdir(parents=True, exist_ok=True)
    tls, scheduler_file = work / "tls", work / "scheduler.json"
    scheduler_file.unlink(missing_ok=True)
    write_credentials(tls)
    credentials = ["--tls-ca-file", str(tls / "ca.pem"), "--tls-cert", str(tls / "cert.pem"),
                   "--tls-key", str(tls / "key.pem")]
    procs = [_start(logs, "scheduler", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                    "--dashboard-address", "127.0.0.1:0", "--protocol", "tls", *credentials,
                    "--scheduler-file", str(scheduler_file), "--preload", "uni_agent.scheduler_preload")]
    try:
        deadline = time.monotonic() + 90
        while not scheduler_file.exists():
            if time.monotonic() > deadline or procs[0].poll() is not None:
                raise RuntimeError(f"no scheduler file; see {logs / 'scheduler.log'}")
            time.sleep(0.2)
        common = ["--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--no-dashboard", *credentials]
        procs.append(_start(logs, "gpu-worker", "distributed.cli.dask_worker", *common, "--name", "gpu-worker",
                            "--nworkers", "1", "--nthreads", "2", "--resources", f"GPU={gpus}"))
        # several processes: each runs its agents' loops on one event loop (docs/benchmarks.md)
        procs.append(_start(logs, "sandbox-workers", "distributed.cli.dask_worker", *common, "--name",
                            "sandbox-worker", "--nworkers", str(sandbox_workers), "--nthreads", str(sandbox_threads),
                            "--resources", f"SANDBOX={sandboxes}"))
        yield scheduler_file, tls
    finally:
        for proc in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _start(logs: Path, name: str, *args: str) -> subprocess.Popen:
    out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - the child keeps it
    return subprocess.Popen([sys.executable, "-m", *args], stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": f"{REPO}:{os.environ.get('PYTHONPATH', '')}"})
