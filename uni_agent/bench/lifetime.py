"""A bench's processes end with it, however it ends (issue 40: a simulation killed by `timeout` left its scheduler,
workers and driver running, and the next invocation measured a machine still busy with them).

Two layers:
- every process the bench starts itself (dask scheduler and workers, the driver, the endpoints, an earlier tree's
  bench under `--baseline`) is started with `preexec_fn=die_with_bench()`: the kernel sends it SIGKILL when the
  bench's process ends, by any signal, SIGKILL included (PR_SET_PDEATHSIG). Their own children follow: a dask
  worker process exits when its nanny's pipe closes (distributed's AsyncProcess), a fork server is bwrap
  `--die-with-parent`, a LocalCluster's workers are the bench's own multiprocessing children (the same pipe);
- SIGTERM and SIGHUP raise SystemExit in the bench's main thread (`stop_on_signals`), so that its `with` blocks
  close what they opened (clusters, endpoints, sandboxes, temp dirs) and it says why it stopped; a second signal
  ends it at once, and the first layer takes the rest.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1
# Resolved here, in the parent: the child, between fork and exec, only makes the call (no loading, no lookup).
_prctl = ctypes.CDLL(None, use_errno=True).prctl
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def die_with_bench() -> Callable[[], None]:
    """A `preexec_fn` that ties the child's life to this process's (SIGKILL when it ends)."""
    parent = os.getpid()

    def tie() -> None:
        _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))
        if os.getppid() != parent:  # the bench ended before the prctl took hold: nothing would signal us
            os._exit(1)

    return tie


def stop_on_signals() -> None:
    """SIGTERM/SIGHUP: the first unwinds the bench (SystemExit 128 + signal), the second ends it at once. Call it
    again after a run call: the run's own handlers (driver/interrupt.py) leave the default behind when they go."""
    received: list[int] = []
    # The process's own stderr, not sys.stderr: a signal may land while a sweep point captures the run's stderr in a
    # buffer (ours.py), and the line saying why the bench stopped would go down with it.
    console = sys.__stderr__ or sys.stderr

    def on_signal(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        if received:
            print(f"uni-agent bench: {name} again: ended at once (its processes end with it)", file=console,
                  flush=True)
            os._exit(128 + signum)
        received.append(signum)
        print(f"uni-agent bench: {name}: stopping, with every process it started (again to end at once)",
              file=console, flush=True)
        raise SystemExit(128 + signum)

    for signum in STOP_SIGNALS:
        try:
            signal.signal(signum, on_signal)
        except ValueError:  # not the main thread (a bench called from a library's thread): leave them
            return
