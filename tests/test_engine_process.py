"""An engine server outlives no worker: what the kernel sends it when the worker dies (ServerActor.DEATH_SIGNAL) ends
it even when it would not end on SIGTERM, as a llama-server can hang in its graceful exit with a request open (its
clients then waited on that connection: a run's start-up hung in CI on 2026-12-04)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_sandbox_local import wait_until_gone

from uni_agent.engines.llama_cpp import LlamaServer
from uni_agent.engines.vllm import VllmServer

# A "worker": launches a server the way a server actor does, says the server's pid, then waits to be killed.
WORKER = textwrap.dedent("""
    import asyncio, sys
    from uni_agent.engines.process import launch

    async def main():
        server = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('up', flush=True); time.sleep(120)"]
        proc = await launch(server, sys.argv[1], {}, int(sys.argv[2]))
        print(proc.pid, flush=True)
        await asyncio.sleep(120)

    asyncio.run(main())
""")


def _server_after_its_worker_is_killed(tmp_path: Path, death_signal: int) -> bool:
    """Whether the server is still alive 5 s after its worker was killed -9."""
    log = tmp_path / f"server-{death_signal}.log"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(log), str(int(death_signal))],
                              stdout=subprocess.PIPE, text=True)
    server = int(worker.stdout.readline())
    try:
        deadline = time.monotonic() + 30
        while "up" not in log.read_text() and time.monotonic() < deadline:  # its SIGTERM handler is in place
            time.sleep(0.05)
        worker.kill()
        worker.wait()
        return bool(wait_until_gone([server], timeout=5))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server, signal.SIGKILL)


def test_a_server_that_ignores_sigterm_still_dies_with_its_worker_when_its_death_signal_is_sigkill(tmp_path):
    assert not _server_after_its_worker_is_killed(tmp_path, signal.SIGKILL)
    # the control: with SIGTERM the same server outlives its worker (what a hung llama-server did)
    assert _server_after_its_worker_is_killed(tmp_path, signal.SIGTERM)


@pytest.mark.parametrize("server, expected", [(LlamaServer, signal.SIGKILL), (VllmServer, signal.SIGTERM)])
def test_each_engine_gets_the_death_signal_its_process_needs(server, expected):
    # llama-server is one process; vLLM's API server stops its engine-core children on SIGTERM
    assert server.DEATH_SIGNAL == expected
