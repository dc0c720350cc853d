"""docs/slurm.md's CPU-only recipe, taken out of the doc and run as written by an ordinary user on a real SLURM
cluster (slurmctld, slurmd and munged on localhost: tests/slurm_fixture.py): cluster/submit.sh --gpu-nodes 0, then
the driver with the default engine, the real llama-server (SmolLM2) on a sandbox worker, real bubblewrap sandboxes,
Parquet rows. Beside the user is a stranger who reached the node first and planted modules in
$TMPDIR/dask-scratch-space, Dask's default scratch space, which Dask puts on its processes' sys.path; and, in the
second test, one who squatted the user's private directory there.

What the test supplies is what the cluster and the user's account would have: SLURM_CONF (a cluster's /etc/slurm),
TMPDIR (the node's /tmp: a fresh 1777 directory, so the planted directory is this test's own), the clone as the working
directory, and the user's llama-server build in ~/.cache/uni-agent (what examples/setup.sh builds there, copied from
this machine's build instead of built again: ~5 minutes on 2 cores).
"""

import http.cookiejar
import json
import os
import re
import shlex
import shutil
import time
import urllib.request
from pathlib import Path

import pandas as pd
import pytest
from distributed import Client
from distributed.security import Security

from conftest import REPO_ROOT
from slurm_fixture import LocalSlurm
from test_slurm import assert_private_scratch
from unprivileged import User, ensure_users, kill_processes_of, remove_users, run_as, shared_dir
from uni_agent.engines import llama_build

USERS = ("ua-slurm-user", "ua-slurm-stranger")
RECIPE_MARK = "<!-- tests/test_slurm_cpu_recipe.py runs this block as written"
PLANTED = ("yaml", "sitecustomize", "usercustomize", "uni_agent", "distributed")
# A planted module leaves a mark naming who imported it, then fails the import.
PLANT = ("import os, pathlib\n"
         "pathlib.Path(__file__).with_name(f'IMPORTED-{__name__}-by-uid-{os.getuid()}').touch()\n"
         "raise ImportError('planted by a stranger')\n")


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("a SLURM cluster of its own and test users need root (slurmctld, slurmd, useradd, apt-get)")
    cluster = LocalSlurm()
    try:
        cluster.start()
        yield cluster
    finally:
        try:
            cluster.stop()
        finally:
            remove_users(USERS)  # the users this module made (their processes, homes, private dirs)


@pytest.fixture
def node_tmp():
    """The node's /tmp for one test: world-writable with the sticky bit, as /tmp is."""
    path = shared_dir("uni-agent-node-tmp-")
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def recipe_from_docs() -> str:
    """The bash block that follows the recipe's marker in docs/slurm.md, unchanged."""
    text = (REPO_ROOT / "docs" / "slurm.md").read_text()
    assert RECIPE_MARK in text, "docs/slurm.md lost its CPU-only recipe (or its marker)"
    return re.search(r"```bash\n(.*?)```", text.split(RECIPE_MARK, 1)[1], re.S).group(1)


def give_llama_build(user: User) -> None:
    """The user's own llama-server build where examples/setup.sh would have put it (~/.cache/uni-agent/llama.cpp)."""
    binary = llama_build.find_binary("cpu")
    if binary is None:
        pytest.skip("no llama-server build: run examples/setup.sh")
    build = binary.parent.parent
    cache = user.home / ".cache" / "uni-agent" / "llama.cpp"
    if not (cache / build.name / "bin" / "llama-server").exists():
        shutil.copytree(build / "bin", cache / build.name / "bin")
    for path in (user.home / ".cache", *(user.home / ".cache").rglob("*")):
        os.chown(path, user.uid, user.gid, follow_symlinks=False)


def plant(stranger: User, node_tmp: Path) -> Path:
    """What the stranger leaves for the user: Dask's default scratch space, made first, 0777, with modules in it."""
    scratch = node_tmp / "dask-scratch-space"
    script = f"mkdir -m 0777 {shlex.quote(str(scratch))} && cd {shlex.quote(str(scratch))} && " + " && ".join(
        f"printf %s {shlex.quote(PLANT)} > {name}.py" for name in PLANTED) + " && chmod 0666 *.py"
    done = run_as(stranger, ["bash", "-c", script])
    assert done.returncode == 0, done.stderr
    return scratch


def sourced(env_file: Path) -> dict[str, str]:
    """The variables a `source` of submit.sh's cluster.env sets."""
    return dict(re.findall(r"(\w+)=(\S+)", env_file.read_text().replace("\\ ", " ")))


def test_cpu_only_recipe_from_the_docs_as_an_ordinary_user(slurm, node_tmp):
    user, stranger = ensure_users(USERS)
    scratch = plant(stranger, node_tmp)
    planted_before = sorted(p.name for p in scratch.iterdir())
    give_llama_build(user)
    env = {"SLURM_CONF": str(slurm.conf), "TMPDIR": str(node_tmp)}
    started = time.monotonic()
    try:  # within pytest's 600 s, so that a run that hangs still ends with its processes and jobs cleaned up
        done = run_as(user, ["bash", "-e", "-c", f"cd {shlex.quote(str(REPO_ROOT))}\n{recipe_from_docs()}"],
                      env=env, timeout=480)
    except BaseException:
        kill_processes_of(user)
        raise
    took = time.monotonic() - started
    shared = user.home / "uni-agent"
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in (shared / "logs").glob("*"))
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}\n{logs}"

    run_dir = shared / "runs" / "cpu-smoke"
    rows = pd.read_parquet(run_dir / "results")
    summary = json.loads((run_dir / "summary.json").read_text())
    print(f"\nCPU-only recipe as {user.name}: {took:.0f} s from submit.sh to the driver's exit, {len(rows)} rows, "
          f"exit reasons {summary['exit_reasons']}")
    assert len(rows) == 4 and sorted(rows.instance_id.value_counts().tolist()) == [2, 2], rows.instance_id
    assert summary["num_rollouts"] == 4 and summary["infra_failures"] == 0, summary
    assert (rows.failure_kind != "infra").all() and rows.messages.map(len).gt(1).all()
    assert all(p.stat().st_uid == user.uid for p in (run_dir / "results").rglob("*.parquet"))
    assert re.search(r"engine: SmolLM2-135M-Instruct at http://", done.stderr), done.stderr[-3000:]

    # The tunnel submit.sh printed names the dashboard's real port, and the page address the driver printed works
    # from the scheduler's node (this one): its token lets the browser in.
    port = re.search(r"ssh -J \S+ -L 8787:localhost:(\d+) localhost", done.stdout).group(1)
    link = re.search(r"uni-agent page: (\S+)", done.stderr).group(1)
    assert f":{port}/" in link, (port, link)
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    page = browser.open(link, timeout=20)
    assert page.status == 200 and b"uni-agent" in page.read().lower()

    # The cluster is still up (the doc's stop line is apart): none of its Dask processes uses the stranger's
    # directory, nor has it on sys.path, and nothing planted there was imported.
    cluster = sourced(shared / "cluster.env")
    tls = Path(cluster["UNI_AGENT_TLS_DIR"])
    security = Security(tls_ca_file=str(tls / "ca.pem"), tls_client_cert=str(tls / "cert.pem"),
                        tls_client_key=str(tls / "key.pem"), require_encryption=True)
    with Client(scheduler_file=cluster["UNI_AGENT_SCHEDULER_FILE"], security=security, timeout=30) as client:
        assert_private_scratch(client, node_tmp, processes=2, uid=user.uid)  # --sandbox-cpus 4: 2 processes
    assert sorted(p.name for p in scratch.iterdir()) == planted_before  # no mark, no worker dir of Dask's
    for private in (Path(cluster["UNI_AGENT_SCHEDULER_FILE"]), *(shared / "logs").iterdir()):
        assert private.stat().st_mode & 0o077 == 0, private  # umask 077 in the scripts

    stop = run_as(user, ["bash", "-c", f"source {shared}/cluster.env && scancel $uni_agent_jobs"], env=env)
    assert stop.returncode == 0, stop.stderr
    slurm.wait_for(lambda: not slurm.jobs(), 60, "the recipe's jobs to end after its scancel line")


def test_a_squatted_private_directory_stops_the_recipe_with_its_reason(slurm, node_tmp):
    """A stranger who made the user's private directory on the node first: the scheduler job stops at once, its log
    says which directory and why, and submit.sh says the job ended instead of printing a cluster that never comes."""
    user, stranger = ensure_users(USERS)
    squatted = node_tmp / f"uni-agent-{user.uid}"
    assert run_as(stranger, ["mkdir", "-m", "0777", str(squatted)]).returncode == 0
    env = {"SLURM_CONF": str(slurm.conf), "TMPDIR": str(node_tmp), "UNI_AGENT_SHARED": str(user.home / "squat")}
    done = run_as(user, ["bash", str(REPO_ROOT / "cluster" / "submit.sh"), "--gpu-nodes", "0", "--wait", "60"],
                  env=env, timeout=120)
    assert done.returncode == 3, (done.stdout, done.stderr)
    job = re.search(r"job (\d+) \(ua-scheduler\) ended \((FAILED|COMPLETED)\)", done.stderr)
    assert job, done.stderr
    log = (user.home / "squat" / "logs" / f"ua-scheduler-{job.group(1)}.out").read_text()
    assert f"uni-agent: private directory {squatted} is owned by {stranger.name}" in log, log
    assert not list(squatted.iterdir())  # nothing of the user's went in
    slurm.cancel_all_and_wait()
