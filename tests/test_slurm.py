"""uni-agent on a real SLURM cluster (slurm-wlm + munge daemons on localhost, started here): the cluster/ sbatch
scripts and the dask-jobqueue launcher each bring up a scheduler, a GPU worker group and a sandbox worker group as
SLURM jobs, and parallel_verify.py / parallel_infer.py run against them with --scheduler-file. Both clusters speak TLS
with the credentials in UNI_AGENT_TLS_DIR (written by submit.sh / the launcher); a client without them is refused.
Every Dask process keeps its scratch space (on its sys.path) in the private directory under TMPDIR. Jobs that could
never start on the node are refused before sbatch, with the reason; submitted anyway (--no-check), they are named
with squeue's reason. docs/slurm.md's CPU-only recipe, as an ordinary user: tests/test_slurm_cpu_recipe.py.

There are no GPUs here: the node's `gpu` GRES is two dummy device files (Slurm allocates them and sets
CUDA_VISIBLE_DEVICES as on a GPU node), and the engine is tests/fake_vllm.py behind a `vllm` executable on PATH,
A STAND-IN FOR vLLM (which needs a GPU and cannot be installed here).
"""

import json
import os
import re
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from distributed import Client

from conftest import REPO_ROOT
from slurm_fixture import LocalSlurm
from stranger import attempts, got_in
from uni_agent.dashboard import page_token
from uni_agent.driver.tls import file_security

EXAMPLES = REPO_ROOT / "examples" / "agent_interaction"
FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"
BUNDLED_FIRST_TWO = ["uni-agent__confini-3", "uni-agent__csvstat-17"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if os.geteuid() != 0:
        pytest.skip("a SLURM cluster of its own needs root: slurmctld and slurmd run as root (SlurmdUser=root), the "
                    "stand-in GPUs are device nodes (mknod), and slurm-wlm and munge are installed with apt-get")
    cluster = LocalSlurm()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()  # fails unless every job has left the queue, then stops the daemons


@pytest.fixture
def job_env(slurm, tmp_path):
    """What a user's shell would have: the venv, a shared directory, and (stand-in) `vllm` on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_VLLM} \"$@\"\n")
    (bin_dir / "vllm").chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir()
    node_tmp = tmp_path / "node-tmp"  # the node's /tmp: the private directory uni-agent-<uid> is made in it
    node_tmp.mkdir(mode=0o1777)
    env = {**slurm.env, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_VLLM_DIR": str(tmp_path / "fake-vllm"),
           "UNI_AGENT_SHARED": str(shared), "UNI_AGENT_VENV": str(REPO_ROOT / ".venv"),
           "UNI_AGENT_TLS_DIR": str(tmp_path / "tls"), "TMPDIR": str(node_tmp)}
    yield env
    slurm.cancel_all_and_wait()


def _run_script(script: Path, *args: str, env: dict, timeout: float = 300) -> dict:
    out_dir = Path(args[args.index("--output-dir") + 1])
    proc = subprocess.run([sys.executable, str(script), *args], env=env, cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out_dir / "summary.json").read_text())


def _check_verify_and_infer(env: dict, out: Path, scheduler_file: str | None) -> None:
    where = ["--scheduler-file", scheduler_file] if scheduler_file else []  # else from UNI_AGENT_SCHEDULER_FILE
    verify = _run_script(EXAMPLES / "parallel_verify.py", "--patch", "gold", "--max-samples", "2", *where,
                         "--output-dir", str(out / "verify"), env=env)
    assert verify["resolved_ids"] == BUNDLED_FIRST_TWO and verify["avg_at_n"] == 1.0
    infer = _run_script(EXAMPLES / "parallel_infer.py", "--engine", "vllm", "--model-path", "/models/Tiny-1B",
                        "--n-gpus-per-node", "2", "--max-samples", "1", "--n", "2", "--no-progress", *where,
                        "--output-dir", str(out / "infer"), env=env)
    assert infer["num_rollouts"] == 2 and infer["exit_reasons"]["submitted"] == 2, infer
    records = [json.loads(p.read_text()) for p in Path(env["FAKE_VLLM_DIR"]).glob("*.json")]
    assert sorted(r["cuda_visible_devices"] for r in records) == ["0", "1"]


def assert_slow_dask_timers(client: Client) -> None:
    """uni_agent.dask_timers, from the job scripts' environment: every server's event-loop tick every 200 ms and its
    system monitor every 2 s, every worker's and nanny's memory monitor every 500 ms (Dask's own: 20, 500 and 100);
    from the scheduler preload, each worker's heartbeat every 2 s once the scheduler answered one (Dask's: 0.5 s)."""
    def timers(dask_worker) -> tuple[float, float | None, float]:  # defined here: sent by value, the workers lack
        callbacks = dask_worker.periodic_callbacks                   # the tests
        monitor = callbacks.get("memory_monitor")
        return callbacks["tick"].callback_time, monitor and monitor.callback_time, callbacks["monitor"].callback_time

    def heartbeat_ms(dask_worker) -> float:
        return dask_worker.periodic_callbacks["heartbeat"].callback_time

    assert set(client.run(timers).values()) | set(client.run(timers, nanny=True).values()) == {(200, 500, 2000)}
    assert client.run_on_scheduler(lambda dask_scheduler: timers(dask_scheduler)) == (200, None, 2000)
    deadline = time.monotonic() + 20
    while set(client.run(heartbeat_ms).values()) != {2000} and time.monotonic() < deadline:
        time.sleep(0.2)  # a worker starts at 1 s; the scheduler's first reply sets it
    assert set(client.run(heartbeat_ms).values()) == {2000}


def dask_timers_are_slow(scheduler_file: str, tls_dir: str) -> None:
    with Client(scheduler_file=scheduler_file, timeout=30, security=file_security(Path(tls_dir))) as client:
        assert_slow_dask_timers(client)


def test_sbatch_scripts(slurm, job_env, tmp_path):
    env = {**job_env, "UNI_AGENT_SCHEDULER_PORT": str(_free_port()), "UNI_AGENT_DASHBOARD_PORT": str(_free_port()),
           "UNI_AGENT_SANDBOXES_PER_NODE": "4", "UNI_AGENT_WORKERS_PER_NODE": "2",
           "UNI_AGENT_SCHEDULER_SBATCH": "--cpus-per-task=1 --mem=1G --time=00:10:00",
           "UNI_AGENT_GPU_SBATCH": "--gres=gpu:2 --cpus-per-task=1 --mem=1G --time=00:10:00",
           "UNI_AGENT_SANDBOX_SBATCH": "--cpus-per-task=1 --mem=1G --time=00:10:00"}
    submitted = subprocess.run(["bash", str(REPO_ROOT / "cluster" / "submit.sh")], env=env, capture_output=True,
                               text=True, timeout=60, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    scheduler_file = re.search(r"scheduler file: (\S+)", submitted.stdout).group(1)
    job_ids = re.search(r"stop:\s+scancel ([\d ]+)", submitted.stdout).group(1).split()
    assert len(job_ids) == 3 and scheduler_file.endswith(f"scheduler-{job_ids[0]}.json")
    assert f"-L 8787:localhost:{env['UNI_AGENT_DASHBOARD_PORT']} localhost" in submitted.stdout  # the tunnel
    for private in (Path(scheduler_file), *Path(env["UNI_AGENT_SHARED"], "logs").iterdir()):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private  # umask 077

    deadline = time.monotonic() + 90
    while not Path(scheduler_file).exists():
        assert time.monotonic() < deadline, f"no scheduler file; jobs: {slurm.jobs()}\n{_job_logs(env)}"
        time.sleep(0.2)
    with Client(scheduler_file=scheduler_file, timeout=30, security=file_security(Path(env["UNI_AGENT_TLS_DIR"]))) \
            as client:
        client.wait_for_workers(3, timeout=90)
        workers = client.scheduler_info(n_workers=-1)["workers"].values()
        assert sorted((w["name"].split("-")[0], w["resources"]) for w in workers) == [
            ("gpu", {"GPU": 2.0}), ("sandbox", {"SANDBOX": 2.0}), ("sandbox", {"SANDBOX": 2.0})]  # 2 processes
        plugins = client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
        assert "uni-agent-gpu-leases" in plugins  # the --preload ran
        environ = client.run(lambda: dict(os.environ))
        assert all(e.get("SLURM_JOB_ID") in job_ids[1:] for e in environ.values())  # workers run inside our jobs
        assert sorted(e.get("CUDA_VISIBLE_DEVICES", "-") for e in environ.values()) == ["-", "-", "0,1"]  # --gres
        assert_private_scratch(client, Path(env["TMPDIR"]), processes=3)
        preloaded = client.run(lambda: "uni_agent.episode.worker" in __import__("sys").modules)
        names = {addr: w["name"] for addr, w in client.scheduler_info(n_workers=-1)["workers"].items()}
        assert {names[a].split("-")[0]: v for a, v in preloaded.items()} == {"gpu": False, "sandbox": True}
        # Dask's profiler off from the job scripts' environment: the GPU worker has no preload to drop its callbacks
        sampling = client.run(lambda dask_worker: "profile" in dask_worker.periodic_callbacks)
        assert {names[a].split("-")[0]: v for a, v in sampling.items()} == {"gpu": False, "sandbox": False}
        assert_slow_dask_timers(client)
        token = client.run_on_scheduler(page_token)  # the preload's: the scheduler's pages need it
    base, bearer = f"http://127.0.0.1:{env['UNI_AGENT_DASHBOARD_PORT']}", {"Authorization": f"Bearer {token}"}
    health = urllib.request.urlopen(urllib.request.Request(f"{base}/health", headers=bearer), timeout=10)
    assert health.read() == b"ok"
    page = urllib.request.urlopen(urllib.request.Request(f"{base}/uni-agent", headers=bearer), timeout=10)
    assert page.status == 200 and b"uni-agent" in page.read().lower()  # installed by the preload, before any driver
    refuses_strangers(scheduler_file, env["UNI_AGENT_TLS_DIR"], workers=3)

    _check_verify_and_infer(env, tmp_path / "out", scheduler_file)

    slurm.run("scancel", *job_ids)
    slurm.wait_for(lambda: not slurm.jobs(), 60, "the jobs to end after scancel")


def test_jobqueue_launcher(slurm, job_env, tmp_path):
    scheduler_file = tmp_path / "shared" / "scheduler.json"
    env = {**job_env, "PYTHONPATH": str(REPO_ROOT / "tests")}
    check = (f"from pathlib import Path; import os, test_slurm as t; "
             f"t.refuses_strangers(os.environ['UNI_AGENT_SCHEDULER_FILE'], os.environ['UNI_AGENT_TLS_DIR'], 3); "
             f"t.cluster_scratch_is_private(os.environ['UNI_AGENT_SCHEDULER_FILE'], os.environ['UNI_AGENT_TLS_DIR'], "
             f"Path(os.environ['TMPDIR']), 3); "
             f"t.dask_timers_are_slow(os.environ['UNI_AGENT_SCHEDULER_FILE'], os.environ['UNI_AGENT_TLS_DIR']); "
             f"t._check_verify_and_infer(dict(os.environ), Path({str(tmp_path / 'out')!r}), None)")
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "cluster" / "launch_jobqueue.py"), "--scheduler-file", str(scheduler_file),
         "--host", "127.0.0.1", "--port", "0", "--dashboard-port", str(_free_port()), "--queue", "debug",
         "--walltime", "00:10:00", "--gpu-jobs", "1", "--gpus-per-job", "2", "--gpu-cores", "1", "--gpu-memory", "1GB",
         "--sandbox-jobs", "1", "--sandboxes-per-job", "4", "--sandbox-cores", "1", "--sandbox-memory", "1GB",
         "--sandbox-processes", "2",
         "--wait", "90", "--", sys.executable, "-c", check],
        env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    assert "3 workers connected" in proc.stdout  # the GPU worker and the sandbox job's 2 processes
    assert " - ERROR - " not in proc.stderr and "never retrieved" not in proc.stderr, proc.stderr[-4000:]
    assert not scheduler_file.exists()
    logs = list((tmp_path / "shared" / "logs").glob("ua-gpu-*.err"))
    assert logs, list((tmp_path / "shared" / "logs").iterdir())
    slurm.wait_for(lambda: not slurm.jobs(), 60, "the launcher's jobs to be cancelled")


def test_submit_refuses_jobs_that_cannot_start(slurm, job_env, tmp_path):
    """Jobs bigger than the node (CPUs, memory, GPUs) or longer than the partition allows are refused before anything
    is submitted, each with its reason and the flag to change. Submitted anyway (--no-check), the oversized job is
    named with squeue's reason (PartitionConfig) instead of waiting in silence, and submit.sh exits 3."""
    def submit(*args: str, **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(REPO_ROOT / "cluster" / "submit.sh"), *args], env={**job_env, **env},
                              capture_output=True, text=True, timeout=120, cwd=tmp_path)

    big = submit("--gpu-nodes", "0", "--sandbox-cpus", "32", "--sandbox-mem", "64G")
    assert big.returncode == 2, big.stderr
    assert ("the sandbox job asks 32 CPUs per node; the largest node of partition debug has 8: pass --sandbox-cpus 8 "
            "or less") in big.stderr
    assert "the sandbox job asks 64G of memory per node; the largest node of partition debug has 15G" in big.stderr
    gpus = submit("--gpus-per-node", "4")
    assert gpus.returncode == 2 and "the GPU job asks 4 GPUs per node; the largest node of partition debug has 2: " \
        "pass --gpus-per-node 2 or less" in gpus.stderr, gpus.stderr
    slow = submit("--gpu-nodes", "0", UNI_AGENT_SANDBOX_SBATCH="--partition short")
    assert slow.returncode == 2 and "the sandbox job asks --time 24:00:00; partition short allows at most 00:30:00: " \
        "pass --time 00:30:00 or less" in slow.stderr, slow.stderr
    assert not slurm.jobs() and not list(Path(job_env["UNI_AGENT_SHARED"]).glob("jobs-*"))  # nothing submitted

    forced = submit("--gpu-nodes", "0", "--sandbox-cpus", "32", "--no-check", "--wait", "30")
    assert forced.returncode == 3, (forced.stdout, forced.stderr)
    assert re.search(r"WARNING: job \d+ \(ua-sandbox-workers\) cannot start: PartitionConfig: the job asks more than",
                     forced.stderr), forced.stderr
    assert re.search(r"cancel with: scancel \d+ \d+", forced.stderr)


def test_jobqueue_launcher_refuses_jobs_that_cannot_start(slurm, job_env, tmp_path):
    """The launcher checks its jobs first (exit 2, nothing submitted); with --no-check a job sbatch refuses, or one
    pending for PartitionConfig, ends it with one ERROR line and exit 1: no traceback, no task left unretrieved, every
    job cancelled."""
    def launch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, str(REPO_ROOT / "cluster" / "launch_jobqueue.py"), "--scheduler-file",
             str(tmp_path / "shared" / "scheduler.json"), "--host", "127.0.0.1", "--dashboard-port", "0",
             "--queue", "debug", "--walltime", "00:10:00", "--wait", "60", *args, "--", "true"],
            env=job_env, capture_output=True, text=True, timeout=120, cwd=tmp_path)

    refused = launch("--gpu-jobs", "0", "--sandbox-cores", "32")
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "the ua-sandbox job asks 32 CPUs per node; the largest node of partition debug has 8: pass " \
        "--sandbox-cores 8 or less" in refused.stderr
    assert not slurm.jobs()
    pending = launch("--gpu-jobs", "0", "--sandbox-cores", "32", "--no-check")
    rejected = launch("--gpu-jobs", "1", "--gpu-memory", "64GB", "--sandbox-cores", "1", "--sandbox-memory", "1GB",
                      "--no-check")
    for proc in (pending, rejected):
        assert proc.returncode == 1, proc.stderr[-3000:]
        assert "Traceback" not in proc.stderr and "never retrieved" not in proc.stderr, proc.stderr[-3000:]
    assert re.search(r"ERROR: job \d+ \(ua-sandbox\) cannot start: PartitionConfig", pending.stderr)
    assert "ERROR: sbatch refused the ua-gpu job: sbatch: error: Batch job submission failed: Requested node " \
        "configuration is not available" in rejected.stderr, rejected.stderr[-3000:]
    slurm.wait_for(lambda: not slurm.jobs(), 30, "the launcher's jobs to be cancelled")


def assert_private_scratch(client: Client, node_tmp: Path, processes: int, uid: int | None = None) -> None:
    """The scheduler's, every worker's and every nanny's Dask scratch space is in the private directory under the
    node's TMPDIR (not TMPDIR/dask-scratch-space, which another user could make first), and no other directory of
    TMPDIR is on their sys.path, where Dask puts its scratch space and a module planted there would be imported."""
    private = node_tmp / f"uni-agent-{os.geteuid() if uid is None else uid}" / "dask"

    def scratch(dask_worker=None, dask_scheduler=None):
        server = dask_worker or dask_scheduler
        return server.local_directory, [p for p in sys.path if p.startswith(str(node_tmp))]

    seen = [client.run_on_scheduler(scratch), *client.run(scratch).values(), *client.run(scratch, nanny=True).values()]
    assert len(seen) == 1 + 2 * processes, seen
    for local, on_path in seen:
        assert Path(local).is_relative_to(private), (local, private)
        assert on_path and all(Path(p).is_relative_to(private) for p in on_path), on_path


def cluster_scratch_is_private(scheduler_file: str, tls_dir: str, node_tmp: Path, processes: int) -> None:
    with Client(scheduler_file=scheduler_file, timeout=30, security=file_security(Path(tls_dir))) as client:
        assert_private_scratch(client, node_tmp, processes)


def refuses_strangers(scheduler_file: str, tls_dir: str, workers: int = 2) -> None:
    """The cluster speaks TLS, answers its credentials, and refuses clients without them (scheduler and workers)."""
    import asyncio

    assert Path(tls_dir, "key.pem").stat().st_mode & 0o777 == 0o600
    with Client(scheduler_file=scheduler_file, timeout=30, security=file_security(Path(tls_dir))) as client:
        addresses = [client.scheduler.address, *client.scheduler_info(n_workers=-1)["workers"]]
    assert len(addresses) == 1 + workers and all(a.startswith("tls://") for a in addresses), addresses

    async def probe():
        return {address: await attempts(address) for address in addresses}

    report = asyncio.run(probe())
    assert not got_in(report), json.dumps(report, indent=1)


def _job_logs(env: dict) -> str:
    logs = Path(env["UNI_AGENT_SHARED"]) / "logs"
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in sorted(logs.glob("*")))
