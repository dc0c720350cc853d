"""A uni-agent Dask cluster on SLURM through dask-jobqueue: the scheduler runs in this process, GPU worker jobs and
sandbox worker jobs are submitted with sbatch (dask-jobqueue's SLURMJob), and the scheduler file is written for
drivers to connect.

    .venv/bin/python cluster/launch_jobqueue.py --scheduler-file ~/uni-agent/scheduler.json \\
        --gpu-jobs 2 --gpus-per-job 8 --gpu-queue gpu --sandbox-jobs 4 --sandbox-cores 32 --queue cpu \\
        -- .venv/bin/python examples/agent_interaction/parallel_infer.py --engine vllm --model-path /models/M \\
           --tp 2 --nnodes 2 --n-gpus-per-node 8 --data-path /shared/swe.parquet --n 4 --output-dir ~/runs/r1

With a command after `--`, the command runs with UNI_AGENT_SCHEDULER_FILE and UNI_AGENT_TLS_DIR set (so the driver
finds the cluster and can connect), every job is cancelled when it ends, and its exit status is this one's; without
one, the cluster stays up until Ctrl-C or SIGTERM. Needs `pip install dask-jobqueue==0.9.0` (the `slurm` extra) and
runs where `sbatch` works (a login node). `--gpu-jobs 0`: a CPU-only cluster (the llama.cpp engine then runs on a
sandbox worker).

Before anything is submitted, each kind of job is checked against its partition (cluster/slurm_check.py): one that
could never start there stops the launcher with the reason (exit 2; --no-check skips this). While it waits for the
workers, a job pending for a reason that never resolves by waiting (PartitionConfig, ReqNodeNotAvail, ...), or that
ended, stops it with the reason (exit 1), as does a job sbatch refuses; every job submitted is cancelled.

The cluster speaks TLS: the scheduler, every worker job and the driver present the certificate in --tls-dir (written
there when missing; it must be on a disk the nodes read), and nothing without it can connect (docs/security.md).
Files are the user's alone (umask 077), and every Dask process keeps its scratch space (which goes on its sys.path)
in the user's private directory on its node (`python -m uni_agent.private_dirs`), never /tmp/dask-scratch-space.
The dashboard listens on 127.0.0.1 unless --dashboard-host says otherwise: `ssh -L 8787:localhost:PORT <this host>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import slurm_check  # noqa: E402  (cluster/ is not a package)


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    command: list[str] = []
    if "--" in argv:
        argv, command = argv[: argv.index("--")], argv[argv.index("--") + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scheduler-file", required=True, help="written once the scheduler is up (shared disk)")
    p.add_argument("--host", default=None, help="address the scheduler listens on (default: this host's)")
    p.add_argument("--interface", default=None, help="network interface for scheduler and workers, e.g. ib0")
    p.add_argument("--port", type=int, default=0, help="the scheduler's port (default 0: any free one)")
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
    p.add_argument("--gpu-jobs", type=int, default=1, help="GPU nodes: one job and one worker each (0: none)")
    p.add_argument("--gpus-per-job", type=int, default=1)
    p.add_argument("--gpu-cores", type=int, default=8)
    p.add_argument("--gpu-memory", default="32GB")
    p.add_argument("--gpu-directive", action="append", default=None,
                   help="sbatch directive of GPU jobs; default --gres=gpu:<gpus-per-job>; repeatable")
    p.add_argument("--sandbox-jobs", type=int, default=1, help="CPU nodes: one job each")
    p.add_argument("--sandboxes-per-job", type=int, default=0,
                   help="sandboxes at once, split among its processes (default 0: 2 per core)")
    p.add_argument("--sandbox-cores", type=int, default=4)
    p.add_argument("--sandbox-processes", type=int, default=0,
                   help="dask worker processes per sandbox job (default 0: one per 2 cores, at least 1): a process "
                        "runs its rollouts' agent loops on one event loop, one core")
    p.add_argument("--sandbox-memory", default="8GB")
    p.add_argument("--job-directive", action="append", default=[], help="sbatch directive of every job; repeatable")
    p.add_argument("--no-check", action="store_true", help="submit without checking the jobs against the partition")
    p.add_argument("--wait", type=float, default=600, help="seconds to wait for the workers before giving up")
    args = p.parse_args(argv)
    if args.gpu_directive is None:
        args.gpu_directive = [f"--gres=gpu:{args.gpus_per_job}"]
    args.sandboxes_per_job = args.sandboxes_per_job or 2 * args.sandbox_cores
    return args, command


def sandbox_processes(args: argparse.Namespace) -> int:
    return args.sandbox_processes or max(1, args.sandbox_cores // 2)


def worker_prologue(python: str) -> list[str]:
    """The job script's lines before `dask worker`: private files, and the checked private local directory of this
    node (Dask puts it on the workers' sys.path), or the job stops with the reason in its log; Dask's profiler off
    unless this launcher keeps it (uni_agent.dask_profiler), its event-loop tick and memory monitor slower unless the
    job's environment sets them (uni_agent.dask_timers)."""
    from uni_agent.dask_profiler import OFF_IN_ENVIRONMENT, profiler_kept
    from uni_agent.dask_timers import IN_ENVIRONMENT

    profiler = [] if profiler_kept() else [f"export {OFF_IN_ENVIRONMENT}"]
    timers = [f'export {name}="${{{name}:-{value}}}"' for name, value in IN_ENVIRONMENT.items()]
    return ["umask 077",
            f'UNI_AGENT_DASK_DIR="$({shlex.quote(python)} -m uni_agent.private_dirs)" || exit 2', *profiler, *timers]


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
        "job_script_prologue": worker_prologue(sys.executable), "local_directory": '"$UNI_AGENT_DASK_DIR"',
        # Sandboxes wait on subprocesses, not on the CPU: one thread per sandbox slot.
        "worker_extra_args": ["--resources", resources] + ([] if gpu else ["--nthreads", str(per_process),
                                                                          "--preload", "uni_agent.worker_preload"]),
    }


FLAGS = {True: {"cpus": "--gpu-cores", "mem": "--gpu-memory", "gpus": "--gpus-per-job", "time": "--walltime"},
         False: {"cpus": "--sandbox-cores", "mem": "--sandbox-memory", "time": "--walltime"}}


def refused(jobs: list[Any]) -> bool:
    """Checks one job of each kind (its own script's #SBATCH lines) against its partition; True when one cannot
    run there (the reasons are printed)."""
    kinds = {job.job_header: job for job in jobs}.values()
    return any([slurm_check.fits(f"the {job.job_name} job", slurm_check.sbatch_lines(job.job_script()),
                                 FLAGS[job.job_name == "ua-gpu"]) != 0 for job in kinds])


async def wait_for_workers(scheduler: Any, wanted: int, jobs: list[Any], timeout: float,
                           stop: asyncio.Event) -> str | None:
    """None once `wanted` workers are connected; else why not (a job that cannot start or ended, the timeout)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    ids = [job.job_id for job in jobs]
    while len(scheduler.workers) < wanted:
        if stop.is_set():
            return "stopped"
        states = await asyncio.to_thread(slurm_check.job_states, ids)
        for job in ids if states is not None else []:  # None: squeue did not answer this time
            name, state, reason, _ = states.get(job, ("?", "ENDED", "", ""))
            why = slurm_check.never_starts(reason) if state == "PENDING" else None
            if why:
                return f"job {job} ({name}) cannot start: {reason}: {why}"
            if state in slurm_check.ENDED or state == "ENDED":
                return f"job {job} ({name}) ended ({state}) before its workers connected: see its log"
        if loop.time() > deadline:
            return (f"{len(scheduler.workers)} of {wanted} workers connected after {timeout:g} s; jobs: "
                    + ", ".join(f"{j} {states[j][1].lower()} ({states[j][2]})" for j in ids if j in (states or {})))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 2)
    return None


async def run_command(command: list[str], env: dict[str, str], stop: asyncio.Event) -> int:
    proc = await asyncio.create_subprocess_exec(*command, env=env)
    stopped = asyncio.create_task(stop.wait())
    finished = asyncio.create_task(proc.wait())
    await asyncio.wait([finished, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if not finished.done():
        proc.terminate()
    return await finished


async def launch(args: argparse.Namespace, command: list[str]) -> int:
    import dask
    from dask_jobqueue.slurm import SLURMJob
    from distributed import Scheduler

    from uni_agent.dask_profiler import dask_config
    from uni_agent.dask_timers import dask_config as timers_config
    from uni_agent.driver.tls import credentials_dir, file_security, write_credentials
    from uni_agent.private_dirs import dask_dir

    local = dask_dir()  # checked: ours, 0700; the scheduler's scratch space (and sys.path entry) goes inside
    tempfile.tempdir = str(local.parent)  # and the job scripts dask-jobqueue writes before sbatch
    tls_dir = credentials_dir(args.tls_dir or os.environ.get("UNI_AGENT_TLS_DIR")).resolve()
    write_credentials(tls_dir)  # keeps valid ones
    security = file_security(tls_dir)  # the worker jobs get the file paths as --tls-* flags
    sandbox, gpu = job_options(args, gpu=False), job_options(args, gpu=True)
    Path(sandbox["log_directory"]).mkdir(parents=True, exist_ok=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


    def make_jobs(address: str) -> list[Any]:
        return ([SLURMJob(scheduler=address, name=f"ua-gpu-{i}", protocol="tls://", security=security, **gpu)
                 for i in range(args.gpu_jobs)]
                + [SLURMJob(scheduler=address, name=f"ua-sandbox-{i}", protocol="tls://", security=security,
                            **sandbox) for i in range(args.sandbox_jobs)])

    if not args.no_check and refused(make_jobs("tls://scheduler:0")):  # before anything starts
        print("nothing submitted (--no-check submits anyway)", file=sys.stderr)
        return 2
    with dask.config.set({"temporary-directory": str(local), **dask_config(), **timers_config()}):
        async with Scheduler(host=args.host, port=args.port, interface=args.interface, protocol="tls",
                             security=security, dashboard_address=f"{args.dashboard_host}:{args.dashboard_port}",
                             preload=["uni_agent.scheduler_preload"]) as scheduler:
            jobs = make_jobs(scheduler.address)
            try:
                for job in jobs:
                    try:
                        await job  # sbatch
                    except RuntimeError as failed:
                        reason = str(failed).strip().splitlines()[-1]
                        print(f"ERROR: sbatch refused the {job.job_name} job: {reason}", file=sys.stderr)
                        return 1
                Path(args.scheduler_file).write_text(json.dumps(scheduler.identity(), indent=2))
                port = scheduler.identity()["services"].get("dashboard")
                print(f"scheduler {scheduler.address}, dashboard {args.dashboard_host}:{port}, scheduler file "
                      f"{args.scheduler_file}, TLS credentials {tls_dir}; jobs: "
                      + ", ".join(f"{job.job_name} {job.job_id}" for job in jobs), flush=True)
                wanted = args.sandbox_jobs * sandbox_processes(args) + args.gpu_jobs
                problem = await wait_for_workers(scheduler, wanted, jobs, args.wait, stop)
                if problem == "stopped":
                    return 130
                if problem:
                    print(f"ERROR: {problem}", file=sys.stderr)
                    return 1
                print(f"{wanted} workers connected", flush=True)
                if not command:
                    await stop.wait()
                    return 0
                env = {**os.environ, "UNI_AGENT_SCHEDULER_FILE": str(Path(args.scheduler_file).resolve()),
                       "UNI_AGENT_TLS_DIR": str(tls_dir)}
                return await run_command(command, env, stop)
            finally:
                for job in jobs:
                    await job.close()  # scancel (nothing for a job never submitted)
                Path(args.scheduler_file).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args, command = parse_args(sys.argv[1:] if argv is None else argv)
    os.umask(0o077)  # the scheduler file, job scripts and logs are the user's alone
    return asyncio.run(launch(args, command))


if __name__ == "__main__":
    sys.exit(main())
