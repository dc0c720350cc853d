"""How a run stops when asked to: Ctrl-C, `kill`, `scancel`, a closed terminal, or SLURM's warning before a job's
time limit (`sbatch --signal=B:USR1@120`).

The first signal cancels the run's main task; cancellation unwinds it the ordinary way (the dispatcher stops, the
agent workers close their sandboxes, the engines stop, the cluster closes) and every finished row is flushed to
Parquet on the way out. The run then raises `RunInterrupted`, which the CLI turns into one line and the exit status
128 + signal number (130 for Ctrl-C). A second signal ends the process at once: its child processes are killed
first, so nothing is left running.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1)
# Set by the run's own LocalCluster for its worker processes (uni_agent.worker_preload then ignores SIGINT there): a
# Ctrl-C in the terminal reaches every process of the foreground group, and the driver alone decides how the run
# stops. A worker that took the SIGINT itself would die mid-call and print its traceback over the driver's one line.
DRIVER_STOPS_ME = "UNI_AGENT_DRIVER_STOPS_WORKER"


class RunInterrupted(Exception):
    """The run was stopped by a signal; what had finished is recorded (`recorded` rows in `output_dir`)."""

    def __init__(self, signum: int, recorded: int | None = None, output_dir: str = ""):
        self.signum, self.recorded, self.output_dir = signum, recorded, output_dir
        where = f" in {output_dir}" if output_dir else ""
        kept = f"{recorded} rollouts recorded{where}" if recorded is not None else f"finished rollouts kept{where}"
        super().__init__(f"stopped by {signal.Signals(signum).name}: {kept}; rerun the same command to resume")

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def run_until_stopped(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main), stopped cleanly by the first of STOP_SIGNALS (RunInterrupted) and at once by a second."""
    return asyncio.run(_stoppable(main))


async def _stoppable(main: Coroutine[Any, Any, T]) -> T:
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(main)
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if received:
            _end_now(received[0])
        received.append(signum)
        print(f"\n{signal.Signals(signum).name}: stopping, writing what has finished (again to end at once)",
              file=sys.stderr, flush=True)
        task.cancel()

    installed = []
    for signum in STOP_SIGNALS:
        with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):  # not the main thread: no handlers
            loop.add_signal_handler(signum, on_signal, signum)
            installed.append(signum)
    try:
        return await task
    except asyncio.CancelledError:
        if not received:
            raise
        raise RunInterrupted(received[0]) from None
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


def _end_now(signum: int) -> None:
    """The second signal: kill our child processes (the LocalCluster's workers, whose engines and sandboxes die with
    them), then exit without unwinding."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(Exception):
            child.kill()
    print(f"{signal.Signals(signum).name} again: ended at once; rerun the same command to resume", file=sys.stderr,
          flush=True)
    os._exit(128 + signum)
