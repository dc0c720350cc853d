"""Placement on a real multi-process cluster: a `dask scheduler` and two `dask worker` processes started from the
command line, one GPU worker (`--resources GPU=2`) and one sandbox worker (`--resources SANDBOX=8`), all speaking TLS
with credentials from `uni-agent tls init` (as the SLURM recipes do): the driver connects with the tls_dir setting,
and a client without those credentials gets nothing.

The engine is tests/fake_vllm.py, run through a `vllm` executable on the workers' PATH: A STAND-IN FOR vLLM, which
needs a GPU and cannot be installed here. Everything around it is real: placement, the GPU leases on the scheduler,
the engine actors and their subprocesses, readiness, the router, agent actors, bubblewrap sandboxes, verification.
The same actor launch path with a real model is tests/test_e2e_llm.py (llama.cpp); the GPU run is in docs/engines.md.
"""

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import Client, get_task_stream

from conftest import AGENT_CONFIG, REPO_ROOT, poll_until
from stranger import attempts, got_in, identity
from uni_agent import AgentConfigs, run
from uni_agent.driver.tls import CredentialsError, file_security, write_credentials
from uni_agent.engines.vllm import VllmServer
from uni_agent.engines.placement import LEASES_PLUGIN, PlacementError, _leases_call, place_replicas, release_replicas

DASK = str(Path(sys.executable).parent / "dask")
FAKE_VLLM = Path(__file__).parent / "fake_vllm.py"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"



@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """scheduler + GPU worker + sandbox worker, as separate `dask` processes; yields a dict of what tests need."""
    tmp = tmp_path_factory.mktemp("cluster")
    bin_dir, records = tmp / "bin", tmp / "fake-vllm"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_VLLM} \"$@\"\n")
    (bin_dir / "vllm").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_VLLM_DIR": str(records),
           "PYTHONPATH": str(REPO_ROOT)}
    scheduler_file = tmp / "scheduler.json"
    tls = tmp / "tls"
    write_credentials(tls)
    credentials = ["--tls-ca-file", str(tls / "ca.pem"), "--tls-cert", str(tls / "cert.pem"),
                   "--tls-key", str(tls / "key.pem")]
    logs = tmp / "logs"
    logs.mkdir()
    procs = []

    def start(name, *args):
        out = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process below
        procs.append((subprocess.Popen([DASK, *args], env=env, stdout=out, stderr=subprocess.STDOUT), out))

    try:
        start("scheduler", "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", "127.0.0.1:0",
              "--protocol", "tls", *credentials, "--scheduler-file", str(scheduler_file),
              "--preload", "uni_agent.scheduler_preload")
        poll_until(scheduler_file.exists, 60, "the scheduler file")
        common = ["--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--no-dashboard", *credentials]
        start("gpu-worker", "worker", *common, "--name", "gpu-worker", "--nthreads", "2", "--resources", "GPU=2")
        start("sandbox-worker", "worker", *common, "--name", "sandbox-worker", "--nthreads", "4",
              "--resources", "SANDBOX=8", "--preload", "uni_agent.worker_preload")  # as cluster/*.sbatch start it
        security = file_security(tls)
        with Client(scheduler_file=str(scheduler_file), security=security) as client:
            client.wait_for_workers(2, timeout=60)
            workers = client.scheduler_info(n_workers=-1)["workers"]
            by_name = {w["name"]: addr for addr, w in workers.items()}
            pids = client.run(os.getpid)
            # Before any test ran an actor there: what the preload imported at the worker's start. (A function
            # defined here is sent by value: the workers cannot import this test module.)
            def rollout_modules_imported() -> list[str]:
                from uni_agent.worker_preload import MODULES

                return [m for m in MODULES if m in sys.modules]

            preloaded = client.run(rollout_modules_imported)

            def profile_callbacks(dask_worker) -> list[str]:
                from uni_agent.dask_profiler import PROFILE_CALLBACKS

                return [name for name in PROFILE_CALLBACKS if name in dask_worker.periodic_callbacks]

            profiling = client.run(profile_callbacks)

            def system_monitor(dask_worker) -> tuple[float, bool]:
                callback = dask_worker.periodic_callbacks["monitor"]
                return callback.callback_time, callback.is_running()

            monitors = client.run(system_monitor)
            yield {"client": client, "scheduler_file": scheduler_file, "tls": tls, "security": security,
                   "records": records, "logs": logs,
                   "gpu": by_name["gpu-worker"], "sandbox": by_name["sandbox-worker"],
                   "gpu_pid": pids[by_name["gpu-worker"]], "preloaded": preloaded, "profiling": profiling,
                   "monitors": monitors}
    finally:
        for proc, out in reversed(procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.close()


def test_the_worker_preload_imports_the_rollout_modules_at_the_worker_s_start(cluster):
    """The sandbox worker (--preload uni_agent.worker_preload) has them before any actor started; the GPU worker,
    started without it, has none: the first run's actors do not wait for the imports."""
    from uni_agent.worker_preload import MODULES

    assert cluster["preloaded"][cluster["sandbox"]] == list(MODULES)
    assert cluster["preloaded"][cluster["gpu"]] == []


def test_the_worker_preload_stops_dasks_profiler_sampling_the_agents_event_loop(cluster):
    """uni_agent.dask_profiler: the sandbox worker, preloaded, has no sampling callbacks; the GPU worker, started
    without the preload (nor the job scripts' environment), keeps Dask's."""
    assert cluster["profiling"][cluster["sandbox"]] == []
    assert cluster["profiling"][cluster["gpu"]] == ["profile", "profile-cycle"]


def test_the_worker_preload_makes_dasks_system_monitor_sample_every_2_s(cluster):
    """uni_agent.worker_monitor: the preloaded sandbox worker samples itself (open files included) every 2 s, and
    does sample; the GPU worker, started without the preload, keeps Dask's 0.5 s."""
    assert cluster["monitors"][cluster["sandbox"]] == (2000, True)
    assert cluster["monitors"][cluster["gpu"]] == (500, True)


@pytest.fixture
def fake(cluster):
    """Clean fake-vLLM records before a test; after it, no fake server may still run."""
    records = cluster["records"]
    records.mkdir(exist_ok=True)
    for f in records.iterdir():
        f.unlink()
    yield records
    leftover = [r["pid"] for r in _servers(records) if _alive(r["pid"])]
    assert not leftover, f"fake vLLM servers outlived the test: {leftover}"
    assert cluster["client"].run_on_scheduler(_leases_call, "busy") == {}, "GPU leases were not released"


def _servers(records: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(records.glob("*.json")) if p.name != "control.json"]


def _served(records: Path, pid: int) -> int:
    path = records / f"{pid}.requests"
    return len(path.read_text().splitlines()) if path.exists() else 0


AGENTS = AgentConfigs.load(AGENT_CONFIG).override_all({"interaction": {"tools_in": "api", "constrain_tool_calls": False}})


def _run(cluster, rows, tmp_path, **overrides):
    settings = dict(engine="vllm", model_path="/models/org/Tiny-Coder-1B", n_gpus_per_node=2, tp=1, agent_workers=2,
                    n=1, output_dir=str(tmp_path / "out"), progress=False, gpu_memory_utilization=0.5,
                    max_model_len=4096, tool_call_parser="qwen3_coder", vllm_extra_args=["--seed", "7"])
    settings.update(overrides)
    return run(rows, AGENTS, scheduler_file=str(cluster["scheduler_file"]), tls_dir=str(cluster["tls"]), **settings)


def test_engines_on_gpu_worker_agents_and_verification_on_sandbox_worker(cluster, rows, tmp_path, fake):
    client = cluster["client"]
    with get_task_stream(client) as stream:
        outcome = _run(cluster, rows[:2], tmp_path, n=2)

    # Two replicas (2 GPUs / tp=1), both children of the GPU worker process, each seeing only its own device.
    servers = _servers(fake)
    assert len(servers) == 2
    assert sorted(s["cuda_visible_devices"] for s in servers) == ["0", "1"]
    assert {s["ppid"] for s in servers} == {cluster["gpu_pid"]}
    argv = servers[0]["argv"]
    assert argv[:2] == ["serve", "/models/org/Tiny-Coder-1B"]
    for flag, value in [("--served-model-name", "Tiny-Coder-1B"), ("--tensor-parallel-size", "1"),
                        ("--gpu-memory-utilization", "0.5"), ("--max-model-len", "4096"),
                        ("--tool-call-parser", "qwen3_coder"), ("--host", "127.0.0.1")]:
        assert argv[argv.index(flag) + 1] == value, (flag, argv)
    assert "--enable-auto-tool-choice" in argv and argv[-2:] == ["--seed", "7"]

    # Every rollout ran on the sandbox worker, talked to the engines (2 turns each), and was verified.
    results = outcome.results
    assert len(results) == 4 and (results.exit_reason == "submitted").all(), results[["exit_reason", "error"]]
    assert set(results.worker) == {cluster["sandbox"]}
    assert (results.num_turns == 2).all()
    assert sum(_served(fake, s["pid"]) for s in servers) == 8
    assert all(_served(fake, s["pid"]) > 0 for s in servers), "the router used only one replica"
    assert all(json.loads(v)["status"] == "unresolved" for v in results.verification)  # `echo` fixes nothing

    placed = {}
    for task in stream.data:
        kind = next((k for k in ("vllm-server-", "agent-worker-", "verify-") if str(task["key"]).startswith(k)), None)
        placed.setdefault(kind, set()).add(task["worker"])
    assert placed["vllm-server-"] == {cluster["gpu"]}, placed
    assert placed["agent-worker-"] == {cluster["sandbox"]}, placed
    assert placed["verify-"] == {cluster["sandbox"]}, placed
    assert (tmp_path / "out" / "logs" / "engine-0.log").read_text().startswith("fake vllm: serving")


def test_dead_replica_rollouts_continue_on_the_other(cluster, rows, tmp_path, fake):
    (fake / "control.json").write_text(json.dumps({"turns": 3, "crash_devices": "0", "crash_after": 2}))
    outcome = _run(cluster, rows[:3], tmp_path, engine_restart_on_crash=False)  # the replica stays down
    results = outcome.results
    assert (results.exit_reason == "submitted").all(), results[["exit_reason", "error"]].to_dict("records")
    assert (results.num_turns == 3).all()
    crashed = next(s for s in _servers(fake) if s["cuda_visible_devices"] == "0")
    other = next(s for s in _servers(fake) if s["cuda_visible_devices"] == "1")
    assert (fake / "crashed-0").read_text() == str(crashed["pid"])
    assert _served(fake, crashed["pid"]) == 2
    assert _served(fake, other["pid"]) == 3 * 3 - 2  # every other turn, including those moved from the dead replica
    events = [json.loads(line) for f in (tmp_path / "out" / "logs").glob("agent-worker-*.jsonl")
              for line in f.read_text().splitlines()]
    moves = [e for e in events if e["event"] == "replica_failover"]
    assert moves and all(e["url_from"].endswith(f":{crashed['port']}/v1") for e in moves)


def test_engine_crash_is_reported_or_restarted_on_the_same_port(cluster, tmp_path, fake):
    client = cluster["client"]
    args = {"executable": "vllm", "model": "m", "served_name": "m", "tp": 1, "gpu_memory_utilization": 0.9,
            "max_model_len": 1024, "tool_call_parser": "hermes"}
    for restart in (False, True):
        future = client.submit(VllmServer, args, "1", str(tmp_path / f"engine-{restart}.log"), restart, 3,
                               actor=True, workers=[cluster["gpu"]], key=f"vllm-crash-test-{restart}")
        actor = future.result()
        try:
            url = actor.start(60).result()
            first = actor.describe().result()
            assert first["alive"] and first["worker"] == cluster["gpu"] and first["cuda_visible_devices"] == "1"
            os.kill(first["pid"], signal.SIGKILL)
            if restart:
                info = poll_until(lambda: (d := actor.describe().result())["restarts"] == 1 and d["alive"] and d, 60,
                             "the restart")
                assert info["url"] == url and info["pid"] != first["pid"]
                assert f"http://127.0.0.1:{_servers(fake)[-1]['port']}/v1" == url  # same port after the restart
                assert "restart 1 of 3" in Path(tmp_path / f"engine-{restart}.log").read_text()
            else:
                info = poll_until(lambda: (d := actor.describe().result())["crashes"] and d, 30, "the crash report")
                assert not info["alive"] and info["restarts"] == 0
                assert info["crashes"][0]["returncode"] == -signal.SIGKILL
                assert "fake vllm: serving" in info["crashes"][0]["log_tail"]
        finally:
            actor.stop().result()
        del actor, future


def test_too_few_gpus_fail_before_anything_starts(cluster, rows, tmp_path, fake):
    with pytest.raises(PlacementError, match=r"need 2 engine replicas of tp=2 .* only 1 fit"):
        _run(cluster, rows[:1], tmp_path, n_gpus_per_node=4, tp=2, worker_wait_timeout=1)
    assert _servers(fake) == []


def test_two_drivers_never_share_a_gpu(cluster, fake):
    async def scenario():
        async with Client(scheduler_file=str(cluster["scheduler_file"]), security=cluster["security"],
                          asynchronous=True) as a, \
                Client(scheduler_file=str(cluster["scheduler_file"]), security=cluster["security"],
                       asynchronous=True) as b:
            first = await place_replicas(a, tp=1, nnodes=1, n_gpus_per_node=1)
            second = await place_replicas(b, tp=1, nnodes=1, n_gpus_per_node=1)
            assert (first[0].worker, second[0].worker) == (cluster["gpu"], cluster["gpu"])
            assert {first[0].cuda_visible_devices, second[0].cuda_visible_devices} == {"0", "1"}
            with pytest.raises(PlacementError, match=r"free \[\]"):
                await place_replicas(b, tp=1, nnodes=1, n_gpus_per_node=1)
            await release_replicas(a)
            third = await place_replicas(b, tp=1, nnodes=1, n_gpus_per_node=1)
            assert third[0].cuda_visible_devices == first[0].cuda_visible_devices
        # b left without releasing: the scheduler dropped its leases with the client.

    asyncio.run(scenario())
    assert LEASES_PLUGIN in cluster["client"].run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
    poll_until(lambda: cluster["client"].run_on_scheduler(_leases_call, "busy") == {}, 10, "leases of closed clients")


def test_one_machine_without_a_scheduler_gets_a_gpu_worker(cluster, rows, tmp_path, fake, monkeypatch):
    """No scheduler given: the run's own LocalCluster adds one GPU worker next to its sandbox workers."""
    monkeypatch.setenv("PATH", f"{fake.parent / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_VLLM_DIR", str(fake))
    outcome = run(rows[:1], AGENTS, engine="vllm", model_path="/models/Tiny-1B", n_gpus_per_node=2, local_workers=1,
                  agent_workers=1, output_dir=str(tmp_path / "out"), progress=False)
    assert outcome.results.exit_reason.tolist() == ["submitted"]
    servers = _servers(fake)
    assert sorted(s["cuda_visible_devices"] for s in servers) == ["0", "1"]
    assert len({s["ppid"] for s in servers}) == 1  # both on the one GPU worker


def test_a_cluster_started_apart_takes_only_its_credentials(cluster, rows, tmp_path):
    """The scheduler and both workers answer the cluster's credentials and refuse everyone else, including credentials
    of another `tls init`; a driver without the files gets a clear error, not a hang."""
    addresses = [cluster["client"].scheduler.address, cluster["gpu"], cluster["sandbox"]]
    own = cluster["security"].get_connection_args("client")
    other = tmp_path / "other-tls"
    write_credentials(other)
    foreign = file_security(other).get_connection_args("client")

    async def probe():
        answers = [(await identity(address, **own))["type"] for address in addresses]
        report = {address: await attempts(address) for address in addresses}
        try:
            await identity(addresses[0], **foreign)
            report[addresses[0]]["tls with another init's credentials"] = "CONNECTED"
        except Exception as exc:  # the handshake or the first read fails
            report[addresses[0]]["tls with another init's credentials"] = f"refused: {exc!r}"
        return answers, report

    answers, report = asyncio.run(probe())
    assert answers == ["Scheduler", "Worker", "Worker"]
    assert not got_in(report), json.dumps(report, indent=1)
    assert report[addresses[0]]["tls with another init's credentials"].startswith("refused")
    with pytest.raises(CredentialsError, match=r"no TLS credentials at .*nowhere"):
        run(rows[:1], AGENTS, scheduler_file=str(cluster["scheduler_file"]), tls_dir=str(tmp_path / "nowhere"),
            engine="external", base_url="http://127.0.0.1:9/v1", model_name="m", output_dir=str(tmp_path / "out"),
            progress=False)
