"""Several llama-servers per GPU group (issue 27): the setting, the slots split among the servers, and the driver's
wait message naming the GPUs it waits for (it said `1 of 0 GPUs` for llama.cpp on GPUs). The wait runs against a
real Dask scheduler with no workers."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging

from distributed import Client, LocalCluster

from uni_agent.driver.cluster import gpus_needed, wait_for_workers
from uni_agent.engines.llama_cpp import DEFAULT_SLOTS, servers_per_group, slots_per_server
from uni_agent.settings import RunSettings


def test_default_is_eight_servers_per_gpu_sharing_the_groups_slots():
    settings = RunSettings()
    assert settings.engine_servers_per_gpu == 8 and settings.engine_replicas == 1
    assert slots_per_server(DEFAULT_SLOTS["cuda"], 8) == 16
    assert slots_per_server(64, 4) == 16 and slots_per_server(64, 1) == 64
    assert slots_per_server(10, 4) == 3  # rounded up: 12 slots for 10 rollouts, never fewer than asked
    placed = servers_per_group([("tcp://a:1", "0")], settings.engine_servers_per_gpu)
    assert [(i, w, d) for i, w, d in placed] == [(k, "tcp://a:1", "0") for k in range(8)]


def test_the_gpus_waited_for_are_the_engines_gpus():
    assert gpus_needed(RunSettings(engine="vllm", n_gpus_per_node=2)) == 2
    assert gpus_needed(RunSettings(engine="llama_cpp", engine_device="gpu", n_gpus_per_node=1)) == 1
    assert gpus_needed(RunSettings(engine="llama_cpp", engine_device="auto")) == 0
    assert gpus_needed(RunSettings(engine="external")) == 0


def _waiting_message(gpus: int) -> str:
    async def main() -> str:
        async with LocalCluster(n_workers=0, processes=False, asynchronous=True, dashboard_address=":0",
                                silence_logs=logging.ERROR) as cluster, \
                Client(cluster, asynchronous=True) as client:
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                await wait_for_workers(client, 1.5, gpu_resource="GPU", gpus=gpus)
            return err.getvalue()

    return asyncio.run(main())


def test_the_wait_message_says_the_gpus_only_when_it_waits_for_some():
    assert "0 for sandboxes, 0 of 1 GPUs" in _waiting_message(1)
    text = _waiting_message(0)
    assert "0 for sandboxes" in text and "GPUs" not in text
