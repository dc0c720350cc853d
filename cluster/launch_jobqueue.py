"""A uni-agent Dask cluster on SLURM through dask-jobqueue: the scheduler runs in this process, GPU worker jobs and
sandbox worker jobs are submitted with sbatch, and the scheduler file is written for drivers to connect.

    python cluster/launch_jobqueue.py --scheduler-file /shared/ua/scheduler.json \\
        --gpu-jobs 2 --gpus-per-job 8 --gpu-queue gpu --sandbox-jobs 4 --sandboxes-per-job 64 --queue cpu \\
        -- python examples/agent_interaction/parallel_infer.py --engine vllm --model-path /models/M --tp 2 \\
           --nnodes 2 --n-gpus-per-node 8 --data-path /shared/swe.parquet --n 4 --output-dir /shared/runs/r1

With a command after `--`, the command runs with UNI_AGENT_SCHEDULER_FILE and UNI_AGENT_TLS_DIR set (so the driver
finds the cluster and can connect) and every job is cancelled when it ends; without one, the cluster stays up until
Ctrl-C or SIGTERM. Needs `pip install dask-jobqueue==0.9.0` (the `slurm` extra) and runs where `sbatch` works (a login
node).

The cluster speaks TLS: the scheduler, every worker job and the driver present the certificate in --tls-dir (written
there when missing; it must be on a disk the nodes read), and nothing without it can connect (docs/security.md). The
dashboard listens on 127.0.0.1 unless --dashboard-host says otherwise: `ssh -L 8787:localhost:8787 <this host>`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    command: list[str] = []
    if "--" in argv:
        argv, command = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scheduler-file", required=True, help="written once the scheduler is up (shared disk)")
    p.add_argument("--host", default=None, help="address the scheduler listens on (default: this host's)")
    p.add_argument("--interface", default=None, help="network interface for scheduler and workers, e.g. ib0")
    p.add_argument("--port", type=int, default=8786)
    p.add_argument("--dashboard-port", type=int, default=8787)
    p.add_argument("--dashboard-host", default="127.0.0.1",
                   help="where the dashboard listens (0.0.0.0: the whole network can read the runs' trajectories)")
    p.add_argument("--tls-dir", default=None,
                   help="the cluster's TLS credentials (default: UNI_AGENT_TLS_DIR, else ~/.config/uni-agent/tls)")
    p.add_argument("--queue", default=None, help="partition for sandbox jobs (and GPU jobs without --gpu-queue)")
    p.add_argument("--gpu-queue", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--walltime", default="24:00:00")
    p.add_argument("--log-directory", default=None, help="job logs (default: next to the scheduler file)")
    p.add_argument("--gpu-jobs", type=int, default=1, help="GPU nodes: one job and one worker each")
    p.add_argument("--gpus-per-job", type=int, default=8)
    p.add_argument("--gpu-cores", type=int, default=16)
    p.add_argument("--gpu-memory", default="200GB")
    p.add_argument("--gpu-directive", action="append", default=None,
                   help="sbatch directive of GPU jobs; default --gres=gpu:<gpus-per-job>; repeatable")
    p.add_argument("--sandbox-jobs", type=int, default=1, help="CPU nodes: one job each")
    p.add_argument("--sandboxes-per-job", type=int, default=32, help="sandboxes at once, split among its processes")
    p.add_argument("--sandbox-cores", type=int, default=16)
    p.add_argument("--sandbox-processes", type=int, default=0,
                   help="dask worker processes per sandbox job (default 0: one per 2 cores, at least 1): a process "
                        "runs its rollouts' agent loops on one event loop, one core")
    p.add_argument("--sandbox-memory", default="64GB")
    p.add_argument("--job-directive", action="append", default=[], help="sbatch directive of every job; repeatable")
    p.add_argument("--wait", type=float, default=600, help="seconds to wait for the workers before giving up")
    args = p.parse_args(argv)
    if args.gpu_directive is None:
        args.gpu_directive = [f"--gres=gpu:{args.gpus_per_job}"]
    return args, command


def sandbox_processes(args: argparse.Namespace) -> int:
    return args.sandbox_processes or max(1, args.sandbox_cores // 2)


def job_options(args: argparse.Namespace, *, gpu: bool) -> dict[str, Any]:
    """What a GPU job (one worker) and a sandbox job (sandbox_processes workers) are, each worker's resource declared
    on the command line."""
    processes = 1 if gpu else sandbox_processes(args)
    per_process = -(-args.sandboxes_per_job // processes)
    if gpu:
        cores, memory, queue = args.gpu_cores, args.gpu_memory, args.gpu_queue or args.queue
        resources, directives = f"GPU={args.gpus_per_job}", [*args.job_directive, *args.gpu_directive]
    else:
        cores, memory, queue = args.sandbox_cores, args.sandbox_memory, args.queue
        resources, directives = f"SANDBOX={per_process}", list(args.job_directive)
    log_directory = args.log_directory or str(Path(args.scheduler_file).resolve().parent / "logs")
    return {
        "cores": cores, "memory": memory, "processes": processes, "queue": queue, "account": args.account,
        "walltime": args.walltime, "job_name": "ua-gpu" if gpu else "ua-sandbox", "interface": args.interface,
        "job_extra_directives": directives, "log_directory": log_directory, "python": sys.executable,
        # Sandboxes wait on subprocesses, not on the CPU: one thread per sandbox slot.
        "worker_extra_args": ["--resources", resources] + ([] if gpu else ["--nthreads", str(per_process),
                                                                          "--preload", "uni_agent.worker_preload"]),
    }


async def launch(args: argparse.Namespace, command: list[str]) -> int:
    from dask_jobqueue import SLURMCluster
    from dask_jobqueue.slurm import SLURMJob
    from distributed import Client

    from uni_agent.driver.tls import credentials_dir, file_security, write_credentials

    tls_dir = credentials_dir(args.tls_dir or os.environ.get("UNI_AGENT_TLS_DIR")).resolve()
    write_credentials(tls_dir)  # keeps valid ones
    security = file_security(tls_dir)  # the worker jobs get the file paths as --tls-* flags
    scheduler_options: dict[str, Any] = {"port": args.port,
                                         "dashboard_address": f"{args.dashboard_host}:{args.dashboard_port}",
                                         "preload": ["uni_agent.scheduler_preload"]}
    if args.host:
        scheduler_options["host"] = args.host
    sandbox = job_options(args, gpu=False)
    gpu = job_options(args, gpu=True)
    Path(sandbox["log_directory"]).mkdir(parents=True, exist_ok=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async with SLURMCluster(asynchronous=True, scheduler_options=scheduler_options, protocol="tls://",
                            security=security, **sandbox) as cluster, \
            Client(cluster, asynchronous=True) as client:
        gpu_jobs = [SLURMJob(scheduler=cluster.scheduler_address, name=f"ua-gpu-{i}", protocol="tls://",
                             security=security, **gpu)
                    for i in range(args.gpu_jobs)]
        try:
            cluster.scale(jobs=args.sandbox_jobs)
            for job in gpu_jobs:
                await job  # sbatch
            client.write_scheduler_file(args.scheduler_file)
            print(f"scheduler {cluster.scheduler_address}, dashboard {args.dashboard_host}:{args.dashboard_port}, "
                  f"scheduler file {args.scheduler_file}, TLS credentials {tls_dir}; "
                  f"jobs: sandbox x{args.sandbox_jobs}, "
                  f"GPU {[j.job_id for j in gpu_jobs]}", flush=True)
            wanted = args.sandbox_jobs * sandbox_processes(args) + args.gpu_jobs
            waiting = asyncio.ensure_future(client.wait_for_workers(wanted, timeout=args.wait))
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([waiting, stopped], return_when=asyncio.FIRST_COMPLETED)
            if stop.is_set():
                waiting.cancel()
                return 130
            stopped.cancel()
            waiting.result()  # a TimeoutError names what is missing
            print(f"{wanted} workers connected", flush=True)
            if not command:
                await stop.wait()
                return 0
            proc = await asyncio.create_subprocess_exec(
                *command, env={**os.environ, "UNI_AGENT_SCHEDULER_FILE": str(Path(args.scheduler_file).resolve()),
                               "UNI_AGENT_TLS_DIR": str(tls_dir)})
            done = asyncio.ensure_future(proc.wait())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([done, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not done.done():
                proc.terminate()
                await proc.wait()
            stopped.cancel()
            return proc.returncode or 0
        finally:
            for job in gpu_jobs:
                await job.close()  # scancel; the sandbox jobs go with the cluster
            Path(args.scheduler_file).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    return asyncio.run(launch(args, command))


if __name__ == "__main__":
    sys.exit(main())
