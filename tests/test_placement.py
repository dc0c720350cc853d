"""GPU placement (pure), the GPU lease table, the `vllm serve` command line, and the router's failover."""

import asyncio
import random

import pytest
import yaml

from conftest import REPO_ROOT
from uni_agent.engines.vllm import VllmServer, vllm_command
from uni_agent.llm import ChatClient, EndpointDownError, LLMError
from uni_agent.engines.placement import GpuLeases, GpuWorker, PlacementError, plan_replicas
from uni_agent.settings import RunSettings
from uni_agent.testing.scripted_llm import ScriptedLLM
from uni_agent.episode.worker import Router


def W(address, gpus, host=None, visible=None, job=None):
    return GpuWorker(address, host or address, gpus, tuple(visible.split(",")) if visible else None, job)


# ---- plan_replicas ----------------------------------------------------------------------------------------------

def test_one_replica_per_gpu_with_distinct_devices():
    replicas = plan_replicas([W("tcp://g:1", 2)], tp=1, nnodes=1, n_gpus_per_node=2)
    assert [(r.index, r.worker, r.devices, r.cuda_visible_devices) for r in replicas] == [
        (0, "tcp://g:1", (0,), "0"), (1, "tcp://g:1", (1,), "1")]


def test_tensor_parallel_replicas_stay_on_one_worker():
    workers = [W("tcp://a:1", 8, "a"), W("tcp://b:1", 8, "b")]
    replicas = plan_replicas(workers, tp=4, nnodes=2, n_gpus_per_node=8)
    assert [(r.worker, r.cuda_visible_devices) for r in replicas] == [
        ("tcp://a:1", "0,1,2,3"), ("tcp://a:1", "4,5,6,7"), ("tcp://b:1", "0,1,2,3"), ("tcp://b:1", "4,5,6,7")]


def test_devices_map_through_the_workers_own_cuda_visible_devices():
    # SLURM gave this worker GPUs 4-7 of its node: local index 0 is device 4.
    replicas = plan_replicas([W("tcp://a:1", 4, visible="4,5,6,7")], tp=2, nnodes=1, n_gpus_per_node=4)
    assert [r.cuda_visible_devices for r in replicas] == ["4,5", "6,7"]
    assert [r.devices for r in replicas] == [(0, 1), (2, 3)]


def test_too_few_gpus_is_a_clear_error():
    with pytest.raises(PlacementError) as info:
        plan_replicas([W("tcp://a:1", 4, "a")], tp=2, nnodes=2, n_gpus_per_node=4)
    assert "need 4 engine replicas of tp=2" in str(info.value) and "only 2 fit" in str(info.value)
    assert "tcp://a:1 (a): GPU=4" in str(info.value)
    with pytest.raises(PlacementError, match="there are none"):
        plan_replicas([], tp=1, nnodes=1, n_gpus_per_node=1)


def test_a_replica_never_spans_workers():
    # 2 + 2 GPUs hold 4 tp=1 replicas but no tp=4 replica.
    workers = [W("tcp://a:1", 2, "a"), W("tcp://b:1", 2, "b")]
    assert len(plan_replicas(workers, tp=1, nnodes=1, n_gpus_per_node=4)) == 4
    with pytest.raises(PlacementError, match="only 0 fit"):
        plan_replicas(workers, tp=4, nnodes=1, n_gpus_per_node=4)


def test_tp_must_divide_the_gpus_of_a_node():
    with pytest.raises(PlacementError, match="does not divide"):
        plan_replicas([W("tcp://a:1", 8)], tp=3, nnodes=1, n_gpus_per_node=8)


def test_busy_devices_are_skipped():
    replicas = plan_replicas([W("tcp://a:1", 4)], tp=2, nnodes=1, n_gpus_per_node=2, busy={"tcp://a:1": [1]})
    assert [r.cuda_visible_devices for r in replicas] == ["2,3"]


def test_workers_that_share_a_hosts_devices_are_refused():
    same = [W("tcp://h:1", 2, "h"), W("tcp://h:2", 2, "h")]
    with pytest.raises(PlacementError, match="both declare GPU 0"):
        plan_replicas(same, tp=1, nnodes=1, n_gpus_per_node=2)
    # Distinct CUDA_VISIBLE_DEVICES on one host, or different SLURM jobs (Slurm gave them different GPUs), are fine.
    split = [W("tcp://h:1", 2, "h", "0,1"), W("tcp://h:2", 2, "h", "2,3")]
    assert [r.cuda_visible_devices for r in plan_replicas(split, tp=1, nnodes=1, n_gpus_per_node=4)] == \
        ["0", "1", "2", "3"]
    jobs = [W("tcp://h:1", 2, "h", "0,1", job="11"), W("tcp://h:2", 2, "h", "0,1", job="12")]
    assert len(plan_replicas(jobs, tp=1, nnodes=2, n_gpus_per_node=2)) == 4


def test_declared_gpus_beyond_cuda_visible_devices_are_an_error():
    with pytest.raises(PlacementError, match="declares 4 GPUs but its CUDA_VISIBLE_DEVICES lists only 2"):
        plan_replicas([W("tcp://a:1", 4, visible="0,1")], tp=1, nnodes=1, n_gpus_per_node=4)


def test_no_device_is_ever_used_twice():
    rng = random.Random(0)
    for _ in range(300):
        workers = [W(f"tcp://w{i}:1", rng.choice([1, 2, 4, 8]), f"h{i}") for i in range(rng.randint(1, 4))]
        tp = rng.choice([1, 2, 4])
        per_node = tp * rng.randint(1, 2)
        busy = {w.address: rng.sample(range(w.gpus), rng.randint(0, w.gpus)) for w in workers}
        try:
            replicas = plan_replicas(workers, tp=tp, nnodes=rng.randint(1, 3), n_gpus_per_node=per_node, busy=busy)
        except PlacementError:
            continue
        used = [(r.worker, d) for r in replicas for d in r.devices]
        assert len(used) == len(set(used))
        assert not any(d in busy[r.worker] for r in replicas for d in r.devices)
        assert all(len(r.devices) == tp for r in replicas)


# ---- GpuLeases (the scheduler plugin's state) --------------------------------------------------------------------

def test_leases_are_all_or_nothing_and_go_with_their_owner():
    leases = GpuLeases()
    assert leases.claim("driver-a", {"w1": [0, 1]}) == {}
    assert leases.claim("driver-b", {"w1": [1, 2], "w2": [0]}) == {"w1": [1]}
    assert leases.busy() == {"w1": [0, 1]}  # b got nothing
    assert leases.claim("driver-a", {"w1": [1]}) == {}  # a claim of one's own devices is no conflict
    assert leases.claim("driver-b", {"w1": [2, 3], "w2": [0]}) == {}
    leases.remove_client(None, "driver-a")
    assert leases.busy() == {"w1": [2, 3], "w2": [0]}
    leases.remove_worker(None, "w1", stimulus_id="test")
    assert leases.busy() == {"w2": [0]}
    leases.release("driver-b")
    assert leases.busy() == {}


# ---- the vLLM command line ---------------------------------------------------------------------------------------

def test_vllm_command_line():
    command = vllm_command("vllm", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "qwen3-coder", tp=4, gpu_memory_utilization=0.85,
                           max_model_len=65536, tool_call_parser="qwen3_coder", host="10.0.0.5", port=8123,
                           sampling={"temperature": 0.7, "top_p": 0.8}, extra_args=["--enable-prefix-caching"])
    assert command == [
        "vllm", "serve", "Qwen/Qwen3-Coder-30B-A3B-Instruct", "--served-model-name", "qwen3-coder",
        "--tensor-parallel-size", "4", "--gpu-memory-utilization", "0.85", "--max-model-len", "65536",
        "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder", "--host", "10.0.0.5", "--port", "8123",
        "--override-generation-config", '{"temperature": 0.7, "top_p": 0.8}', "--enable-prefix-caching"]
    container = vllm_command("apptainer exec --nv /sif/vllm.sif vllm", "/m", "m", tp=1, gpu_memory_utilization=0.9,
                             max_model_len=8192, tool_call_parser="hermes", host="h", port=1)
    assert container[:6] == ["apptainer", "exec", "--nv", "/sif/vllm.sif", "vllm", "serve"]
    assert "--override-generation-config" not in container


def test_vllm_server_sees_exactly_its_devices():
    args = {"executable": "vllm", "model": "/m", "served_name": "m", "tp": 2, "gpu_memory_utilization": 0.9,
            "max_model_len": 8192, "tool_call_parser": "hermes"}
    server = VllmServer(args, "4,5", "/tmp/engine.log")
    assert server.env == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert server.command("127.0.0.1", 9000)[:3] == ["vllm", "serve", "/m"]


def test_vllm_settings_are_in_the_default_file_with_the_class_defaults():
    defaults = yaml.safe_load((REPO_ROOT / "settings" / "default.yaml").read_text())
    fields = RunSettings.model_fields
    for key in ("gpu_resource_name", "vllm_executable", "gpu_memory_utilization", "max_model_len",
                "tool_call_parser", "vllm_extra_args", "engine_restart_on_crash", "engine_max_restarts",
                "worker_wait_timeout"):
        assert key in defaults and key in fields, key
        default = fields[key].default_factory() if fields[key].default_factory else fields[key].default
        assert defaults[key] == default, key
    with pytest.raises(Exception, match="gpu_memory_utilization"):
        RunSettings(gpu_memory_utilization=1.5)


# ---- router failover (real HTTP servers) -------------------------------------------------------------------------

def _reply(text):
    return lambda body: {"role": "assistant", "content": text}


def test_a_rollout_stays_on_its_replica_and_moves_when_it_dies():
    async def scenario(a, b):
        clients = {s.base_url: ChatClient(s.base_url, "m", retry_unreachable=False, max_attempts=2) for s in (a, b)}
        router = Router(clients, down_for=30, give_up_after=5)
        first, second = router.session(), router.session()
        assert {first.url, second.url} == {a.base_url, b.base_url}  # least-loaded: one each
        for _ in range(3):
            assert (await first.chat([{"role": "user", "content": "hi"}])).content == \
                ("A" if first.url == a.base_url else "B")
        assert len(a.requests) + len(b.requests) == 3 and min(len(a.requests), len(b.requests)) == 0  # sticky
        dying = a if first.url == a.base_url else b
        survivor = b if dying is a else a
        dying.__exit__(None, None, None)  # the replica dies
        reply = await first.chat([{"role": "user", "content": "again"}])
        assert first.url == survivor.base_url and reply.content == ("B" if survivor is b else "A")
        assert router.failovers == 1 and router.load == {a.base_url: 0, b.base_url: 0} | {survivor.base_url: 2}
        third = router.session()  # new rollouts avoid the dead replica
        assert third.url == survivor.base_url
        for session in (first, second, third):
            session.close()
        assert set(router.load.values()) == {0}
        for client in clients.values():
            await client.aclose()

    with ScriptedLLM(_reply("A")) as a, ScriptedLLM(_reply("B")) as b:
        asyncio.run(scenario(a, b))


def test_every_replica_down_is_a_clear_error():
    async def scenario(urls):
        clients = {u: ChatClient(u, "m", retry_unreachable=False, max_attempts=1) for u in urls}
        router = Router(clients, down_for=0.2, give_up_after=1)
        session = router.session()
        with pytest.raises(LLMError, match="every engine replica is down") as info:
            await session.chat([{"role": "user", "content": "hi"}])
        assert isinstance(info.value.__cause__, EndpointDownError)
        assert router.failovers >= 1
        for client in clients.values():
            await client.aclose()

    # Ports nothing listens on: bound, then closed.
    ports = []
    for _ in range(2):
        with ScriptedLLM(_reply("x")) as server:
            ports.append(server.base_url)
    asyncio.run(scenario(ports))


def test_one_replica_is_retried_not_abandoned():
    """An external endpoint restarting: the single replica is retried (backoff), as before the router existed."""
    client = ChatClient("http://127.0.0.1:9/v1", "m", max_attempts=2)
    router = Router({client.base_url: client})

    async def scenario():
        with pytest.raises(EndpointDownError):
            await router.session().chat([{"role": "user", "content": "hi"}])
        await client.aclose()

    asyncio.run(scenario())
    assert router.failovers == 0

