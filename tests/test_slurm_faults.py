"""Faults on a real SLURM cluster, as an ordinary user runs uni-agent there (issue 38's "Done when"): slurmctld,
slurmd and munged on localhost (tests/slurm_fixture.py), the cluster of docs/slurm.md's CPU-only recipe
(cluster/submit.sh --gpu-nodes 0) plus a second sandbox-worker job, as `sbatch cluster/sandbox-workers.sbatch` adds one.

1. The sandbox-worker job that holds the llama-server (the real one, SmolLM2, on a sandbox worker as on a CPU-only
   cluster) is `scancel`ed mid-run: the engine is placed again on the other job's worker, the driver says which engine
   went down and on which worker, and no rollout is recorded as the model's failure for the outage.
2. The driver as a job (cluster/driver.sbatch) is stopped mid-run twice: by SLURM's warning before its time limit
   (`--signal=B:USR1@N`, which driver.sbatch asks for) and by `scancel` (SIGTERM). Each time every finished rollout
   is on disk, as many as the driver's last line says, and the last rerun runs only the rest. The model there is a
   ScriptedLLM (a real HTTP server with scripted replies, in this test process): rollouts end in seconds, and
   rollouts past a number the test sets are held at their first reply, so that some are finished and some in flight
   when the signal comes. The sandboxes and their grading are real.
"""

import json
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest
from distributed import Client
from distributed.security import Security

from conftest import (FORK_SERVER_MARK, REPO_ROOT, SANDBOX_PROCESSES, _cmd, _sandboxes_in_fork_servers,
                      assistant_turns, poll_until, scripted_run_inputs)
from test_run_dask import solver
from test_slurm_cpu_recipe import USERS, give_llama_build, slurm, sourced  # noqa: F401 - slurm: the cluster fixture
from unprivileged import User, ensure_users, kill_processes_of, popen_as, run_as, shared_dir
from uni_agent.episode.exit_reason import ExitReason
from uni_agent.testing.llama_watch import engine_port, server_pids
from uni_agent.testing.scripted_llm import ScriptedLLM

PYTHON = REPO_ROOT / ".venv" / "bin" / "python"
INFER = REPO_ROOT / "examples" / "agent_interaction" / "parallel_infer.py"
SANDBOX_JOB = ("--cpus-per-task", "2", "--mem", "2G")  # one worker process, SANDBOX=4: two such jobs fit the node


@dataclass
class UserCluster:
    user: User
    env: dict[str, str]  # the user's shell after `source $UNI_AGENT_SHARED/cluster.env`
    shared: Path
    node_tmp: Path  # the node's /tmp: the user's private directory (its sandboxes) is in it
    client: Client  # the test's own look at the scheduler (with the user's credentials, as root may read them)


def sbatch(cluster: UserCluster, *args: str) -> str:
    """`sbatch` from the clone, as the user; the job id."""
    done = run_as(cluster.user, ["bash", "-c", 'cd "$0" && exec sbatch --parsable "$@"', str(REPO_ROOT),
                                 "--output", f"{cluster.shared}/logs/%x-%j.out", *args], env=cluster.env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def job_log(cluster: UserCluster, job: str) -> str:
    return "\n".join(p.read_text(errors="replace") for p in (cluster.shared / "logs").glob(f"*-{job}.out"))


@pytest.fixture(scope="module")
def cluster(slurm):  # noqa: F811 - the imported fixture
    """docs/slurm.md's CPU-only cluster with a second sandbox-worker job, both connected, as the user."""
    node_tmp = shared_dir("uni-agent-node-tmp-")
    node_tmp.chmod(0o1777)  # the node's /tmp
    [user] = ensure_users(USERS[:1])
    give_llama_build(user)
    shared = user.home / "uni-agent-faults"
    env = {"SLURM_CONF": str(slurm.conf), "TMPDIR": str(node_tmp), "UNI_AGENT_SHARED": str(shared)}
    started = time.monotonic()
    done = run_as(user, ["bash", "-c", f"cd {REPO_ROOT} && bash cluster/submit.sh --gpu-nodes 0 --sandbox-nodes 1 "
                         f"--sandbox-cpus 2 --sandbox-mem 2G --scheduler-mem 1G"], env=env, timeout=180)
    assert done.returncode == 0, (done.stdout, done.stderr)
    found = sourced(shared / "cluster.env")
    env.update(UNI_AGENT_SCHEDULER_FILE=found["UNI_AGENT_SCHEDULER_FILE"], UNI_AGENT_TLS_DIR=found["UNI_AGENT_TLS_DIR"])
    tls = Path(found["UNI_AGENT_TLS_DIR"])
    security = Security(tls_ca_file=str(tls / "ca.pem"), tls_client_cert=str(tls / "cert.pem"),
                        tls_client_key=str(tls / "key.pem"), require_encryption=True)
    client = Client(scheduler_file=env["UNI_AGENT_SCHEDULER_FILE"], security=security, timeout=60)
    try:
        ours = UserCluster(user, env, shared, node_tmp, client)
        second = sbatch(ours, *SANDBOX_JOB, "cluster/sandbox-workers.sbatch")
        try:
            client.wait_for_workers(2, timeout=180)
        except TimeoutError:
            pytest.fail(f"the second sandbox job {second} never connected: {slurm.jobs()}\n{job_log(ours, second)}")
        print(f"\ncluster up (scheduler and two sandbox-worker jobs) in {time.monotonic() - started:.0f} s")
        yield ours
    finally:
        client.close()
        slurm.cancel_all_and_wait()
        kill_processes_of(user)
        shutil.rmtree(node_tmp, ignore_errors=True)


def slurm_job_of(pid: int) -> str:
    """The SLURM job a process runs in (slurmstepd gives every process of a job SLURM_JOB_ID)."""
    environ = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in v)
    return environ["SLURM_JOB_ID"]


def open_rollouts_by_job(out: Path) -> dict[str, int]:
    """Rollouts begun (their sandbox_started line) and not yet recorded, per SLURM job of the agent worker whose log
    file (agent-worker-<pid>.jsonl) says so; a worker gone is left out. Read while the run writes: a line not yet
    whole is skipped."""
    def keys(path: Path, name: str) -> set[tuple[str, int]]:
        return {(e["instance_id"], e["rollout"]) for line in path.read_text().splitlines()
                if line.endswith("}") and (e := json.loads(line)).get("event") == name}

    recorded = set().union(*(keys(f, "rollout_recorded") for f in (out / "logs").glob("driver-*.jsonl")))
    found: dict[str, int] = {}
    for log in (out / "logs").glob("agent-worker-*.jsonl"):
        try:
            job = slurm_job_of(int(log.stem.rsplit("-", 1)[1]))
        except (OSError, KeyError, ValueError):
            continue
        found[job] = found.get(job, 0) + len(keys(log, "sandbox_started") - recorded)
    return found


def events(out: Path, name: str) -> list[dict]:
    return [e for f in (out / "logs").glob("*.jsonl") for line in f.read_text().splitlines()
            if (e := json.loads(line)).get("event") == name]


# ---- 1. the sandbox-worker job holding the engine cancelled ---------------------------------------------------------

@pytest.mark.llm
@pytest.mark.timeout(1500)  # SmolLM2 on 2 cores under SLURM: 221-428 s at load 12-23; the suite's 600 s ends pytest
def test_the_job_holding_the_engine_cancelled_mid_run_every_rollout_still_counts(cluster, slurm):  # noqa: F811
    out = cluster.shared / "runs" / "engine-lost"
    log = out / "logs" / "engine-0.log"
    argv = [str(PYTHON), str(INFER), "--max-samples", "2", "--n", "2", "--max-turns", "3", "--max-tokens", "48",
            "--no-progress", "--output-dir", str(out)]
    started = time.monotonic()
    driver = popen_as(cluster.user, argv, env=cluster.env)
    try:
        poll_until(lambda: len(server_pids(engine_port(log) or 0)) == 1 or driver.poll() is not None, 360,
                   "the engine to start")
        assert driver.poll() is None, driver.communicate()[1][-5000:]
        port = engine_port(log)
        [server] = server_pids(port)
        job = slurm_job_of(server)
        # Cancel once a rollout has begun on the other job's worker: it must wait for the engine and go on with it.
        # (Neither the engine's answers nor open sandboxes say so: the engine's first answer may be the shared prompt's
        # read, and sandboxes start while the engine loads. The clean-clone CI at 706a610 once cancelled too early.)
        poll_until(lambda: any(n for j, n in open_rollouts_by_job(out).items() if j != job)
                   or driver.poll() is not None, 360, "a rollout begun on the other job's worker")
        assert driver.poll() is None, driver.communicate()[1][-5000:]
        workers = cluster.client.scheduler_info(n_workers=-1)["workers"]
        [lost] = [addr for addr, w in workers.items() if str(w["name"]).startswith(f"sandbox-{socket.gethostname()}-"
                                                                                    f"{job}")]
        [survivor] = [addr for addr in workers if addr != lost]
        cancel = run_as(cluster.user, ["scancel", job], env=cluster.env)
        assert cancel.returncode == 0, cancel.stderr
        cancelled_at, cancelled_wall = time.monotonic(), time.time()
        _, err = driver.communicate(timeout=540)
    finally:
        if driver.poll() is None:
            kill_processes_of(cluster.user)  # the driver only: the jobs' processes are SLURM's (cancelled at the end)
    took = time.monotonic() - started
    assert driver.returncode == 0, err[-5000:]

    # The driver said which engine went down and where, and where it serves again.
    assert f"on worker {lost}) is down: its worker left; placing it again" in err, err[-5000:]
    [replaced] = events(out, "engine_replaced")
    assert replaced["worker"] == survivor, (replaced, survivor)
    assert f"serves again at {replaced['url']} on worker {survivor}" in err, err[-5000:]
    assert engine_port(log) == port and not replaced["url"].endswith(f":{port}/v1"), (port, replaced)

    # Every rollout is recorded, and none as the model's failure for the engine's outage: an outage may only be an
    # infra row (engine_down), which the run itself runs again.
    rows = pd.read_parquet(out / "results")
    outcome = rows[["instance_id", "rollout", "exit_reason", "failure_kind", "failure_cause", "worker"]]
    assert len(rows) == 4 and not rows.duplicated(["instance_id", "rollout"]).any(), outcome.to_dict("records")
    assert not rows.exit_reason.isin([ExitReason.WALL_CLOCK, ExitReason.ERROR]).any(), outcome.to_dict("records")
    down = rows[rows.failure_kind == "infra"]
    assert (down.exit_reason == ExitReason.ENGINE_DOWN).all(), outcome.to_dict("records")
    assert set(rows.worker) <= {lost, survivor}
    # Rollouts in flight on the other job's worker waited for the engine and went on with it in its new place.
    across = (rows.started_at < cancelled_wall) & (rows.finished_at > cancelled_wall)
    spanning = rows[across & (rows.worker == survivor)]
    assert len(spanning) >= 1, json.dumps(outcome.assign(  # a string: pytest prints it whole, a list it cuts short
        started_at=rows.started_at, finished_at=rows.finished_at, cancelled=cancelled_wall, survivor=survivor,
        lost=lost).to_dict("records"), default=str)
    summary = json.loads((out / "summary.json").read_text())
    print(f"\nengine's job {job} cancelled {cancelled_at - started:.0f} s into the run; engine serving again on the "
          f"other job's worker after {replaced['down_s']:.1f} s; {len(spanning)} rollouts in flight there went on "
          f"across it; run {took:.0f} s, {len(rows)} rows, exit reasons "
          f"{summary['exit_reasons']}, {len(down)} infra\n"
          + "\n".join(line for line in err.splitlines() if "engine" in line))
    if len(down):  # still infra after the run's own reruns: the next run runs them, without --retry-errors
        again = run_as(cluster.user, argv, env=cluster.env, timeout=400)
        assert f"{len(rows) - len(down)} already done in {out}, {len(down)} to run" in again.stderr, again.stderr


# ---- 2. the driver job stopped by SLURM -----------------------------------------------------------------------------

class HeldAfter:
    """The scripted model's policy: the solver for the rollouts that start while `allow`'s budget lasts; a later
    rollout's first reply is held until `open` (it stays in flight, unfinished, until the driver stops)."""

    def __init__(self) -> None:
        self.lock, self.opened = threading.Lock(), threading.Event()
        self.started = self.allowed = 0

    def allow(self, more: int) -> None:
        with self.lock:
            self.allowed = self.started + more

    def open(self) -> None:
        self.opened.set()

    def __call__(self, body: dict) -> dict:
        if assistant_turns(body) == 0:
            with self.lock:
                self.started += 1
                held = self.started > self.allowed
            if held:
                self.opened.wait(600)
        return solver(body)


@pytest.fixture
def inputs(cluster):
    """Six bundled tasks and an agent config for a scripted model, where the user can read them."""
    where = shared_dir("uni-agent-faults-inputs-")
    data, config = scripted_run_inputs(where)
    pd.read_parquet(data).head(6).to_parquet(data)
    yield data, config
    shutil.rmtree(where, ignore_errors=True)


@pytest.mark.timeout(1200)
def test_the_driver_job_stopped_mid_run_keeps_every_finished_rollout(cluster, slurm, inputs):  # noqa: F811
    data, config = inputs
    out = cluster.shared / "runs" / "driver-stopped"
    total = len(pd.read_parquet(data))
    gate = HeldAfter()
    with ScriptedLLM(gate) as model:
        flags = ("cluster/driver.sbatch", "--data-path", str(data), "--agent-config-path", str(config), "--n", "1",
                 "--engine", "external", "--base-url", model.base_url, "--model", "scripted", "--output-dir", str(out))
        try:
            # SLURM's warning before the job's time limit: driver.sbatch's --signal=B:USR1@N, with a time limit and
            # N small enough for a test. SLURM looks at time limits every 30 s and sends it up to 30 s early: here
            # 90-120 s after the start (the held rollouts are still in flight, the others long finished)
            assert re.search(r"^#SBATCH --signal=B:USR1@\d+$", (REPO_ROOT / flags[0]).read_text(), re.M)
            gate.allow(2)
            started = time.time()
            first = sbatch(cluster, "--time", "3", "--signal", "B:USR1@60", *flags)
            slurm.wait_for(lambda: not [j for j in slurm.jobs() if j.startswith(f"{first} ")], 200,
                           f"the driver job {first} to stop before its time limit")
            finished_after = [round(_seconds(e["timestamp"]) - started) for e in events(out, "rollout_recorded")]
            print(f"\ndriver job {first}: rollouts finished {finished_after} s after sbatch, SIGUSR1 from SLURM, "
                  f"the job gone {time.time() - started:.0f} s after sbatch")
            warned = stopped(cluster, first, out, "SIGUSR1", model)

            # scancel: SIGTERM (KillWait seconds before SIGKILL: 5 s on this cluster, 30 s by default)
            gate.allow(2)
            second = sbatch(cluster, *flags)
            poll_until(lambda: len(events(out, "rollout_recorded")) >= warned + 2, 240,
                       f"two more rollouts finished in driver job {second}")
            assert sandboxes_of(cluster), "no sandbox open while rollouts are held (the check below would see none)"
            cancelled = time.monotonic()
            cancel = run_as(cluster.user, ["scancel", second], env=cluster.env)
            assert cancel.returncode == 0, cancel.stderr
            slurm.wait_for(lambda: not [j for j in slurm.jobs() if j.startswith(f"{second} ")], 60,
                           f"the driver job {second} to end after scancel")
            recorded = stopped(cluster, second, out, "SIGTERM", model)
            assert recorded >= warned + 2
            state = re.findall(r"(JobState|ExitCode)=(\S+)", slurm.run("scontrol", "show", "job", second).stdout)
            print(f"driver job {second}: scancel -> gone in {time.monotonic() - cancelled:.1f} s ({state}), "
                  f"{recorded} rollouts recorded")

            gate.open()
            last = sbatch(cluster, *flags)
            slurm.wait_for(lambda: not [j for j in slurm.jobs() if j.startswith(f"{last} ")], 300,
                           f"the driver job {last} to end")
        finally:
            gate.open()  # held replies go out (to closed connections), so the server's threads end
    text = job_log(cluster, last)
    assert f"{recorded} already done in {out}, {total - recorded} to run" in text, text[-5000:]
    rows = pd.read_parquet(out / "results")
    assert len(rows) == total and not rows.duplicated(["instance_id", "rollout"]).any(), text[-5000:]
    assert (rows.failure_kind == "none").all(), rows[["instance_id", "exit_reason", "failure_cause"]]
    assert "Traceback" not in text, text[-5000:]


def _seconds(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def stopped(cluster: UserCluster, job: str, out: Path, signame: str, model: ScriptedLLM) -> int:
    """How many rollouts the stopped driver job left on disk, after checking that it is every one that finished (its
    log's rollout_recorded events, this run's and the earlier ones'), that its last line says so, and that the
    rollouts it left in flight closed their sandboxes on the workers."""
    text = job_log(cluster, job)
    rows = pd.read_parquet(out / "results") if (out / "results").is_dir() else pd.DataFrame()
    finished = events(out, "rollout_recorded")
    assert len(rows) == len(finished) >= 1, (len(rows), len(finished), model.num_requests, text[-5000:])
    assert text.rstrip().splitlines()[-1] == (f"stopped by {signame}: {len(rows)} rollouts recorded in {out}; rerun "
                                              "the same command to resume"), text[-5000:]
    assert "Traceback" not in text, text[-5000:]
    poll_until(lambda: not sandboxes_of(cluster), 30, f"the sandboxes of driver job {job}'s rollouts to close")
    return len(rows)


def sandboxes_of(cluster: UserCluster) -> list[str]:
    """The user's sandboxes running on the node (a worker's fork server, which lives as long as its worker, aside)."""
    markers = (str(cluster.node_tmp),)
    return [cmd for cmd in map(_cmd, Path("/proc").glob("[0-9]*"))
            if cmd.startswith(SANDBOX_PROCESSES) and str(cluster.node_tmp) in cmd and FORK_SERVER_MARK not in cmd
            ] + _sandboxes_in_fork_servers(markers)
