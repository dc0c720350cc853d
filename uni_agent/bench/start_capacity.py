"""How many local sandboxes a second this machine starts, with one fork server or with several at once.

A wave's sandbox starts queue when they come faster than the machine makes sandboxes: a worker's fork server makes
one at a time, and all the workers' fork servers share the cores (a start-command-close cycle costs ~13 ms of the
machine's CPU, docs/benchmarks.md). This measures that capacity, the figure to keep a run's `start_rate` under when
the wave's starts should not wait for each other (issue 40's goal 2):

    python -m uni_agent.bench.start_capacity --fork-servers 1,12 --sandboxes 1024

For each count K, K processes (each a worker's stand-in, with its own fork server, booted and probed before the
clock starts) start SANDBOXES / K sandboxes each, all at once; printed: when the last was ready, the machine-wide
starts a second, the start p50/p95 as each caller saw it. `--without-network-namespace` is an experiment, not a
setting: each sandbox then shares its fork server's network namespace (itself apart from the host's) instead of
getting its own, which shows what the network namespace costs. `--kernel` first times bare unshare(2) of each
namespace kind in K processes at once (a fork that unshares and exits, 200 each): whether the kernel makes them side
by side or one at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import multiprocessing
import os
import threading
import time
from typing import Any

from .sandbox_rtt import built, deployment

NAMESPACES = {  # unshare(2) flags: what a sandbox's maker unshares (fork_server_main.py), by kind
    "network": 0x40000000,
    "mount": 0x00020000,
    "pid, ipc, uts, cgroup": 0x20000000 | 0x08000000 | 0x04000000 | 0x02000000,
}
UNSHARES_PER_PROCESS = 200
WAIT_S = 600.0  # for a wave's processes to boot their fork servers, and for their answers
SETTLE_S = 3.0  # between measurements: a closed sandbox's namespaces are freed by a kernel worker afterwards


def _unshare_loop(flags: int, count: int, barrier: Any, results: Any) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    barrier.wait()
    began = time.monotonic()
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if libc.unshare(flags) == 0 else 1)
        _, status = os.waitpid(pid, 0)
        if status:
            results.put(None)  # not permitted here (no root, no user namespace)
            return
    results.put(time.monotonic() - began)


def kernel_rate(flags: int, processes: int, count: int = UNSHARES_PER_PROCESS) -> float | None:
    """unshare(flags) calls a second, machine-wide, with `processes` processes at it at once; None if refused."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(processes + 1), context.Queue()
    workers = [context.Process(target=_unshare_loop, args=(flags, count, barrier, results)) for _ in range(processes)]
    for worker in workers:
        worker.start()
    barrier.wait()
    began = time.monotonic()
    answers = [results.get() for _ in workers]
    wall = time.monotonic() - began
    for worker in workers:
        worker.join()
    return None if None in answers else processes * count / wall


def _without_network_namespace() -> None:
    """This process's fork server, once started, gives its sandboxes no network namespace of their own."""
    from ..sandbox import fork_server

    source = fork_server.FORK_SERVER_SOURCE
    changed = source.replace("| CLONE_NEWNET ", "").replace("    _loopback_up()\n", "")
    if changed.count("CLONE_NEWNET") != source.count("CLONE_NEWNET") - 1:
        raise SystemExit("--without-network-namespace: fork_server_main.py no longer reads as this experiment expects")
    fork_server.FORK_SERVER_SOURCE = changed


def _start_wave(sandboxes: int, no_network_namespace: bool, barrier: Any, results: Any) -> None:
    """One worker's stand-in: its answer, or what failed (the others then stop waiting at the barrier)."""
    try:
        if no_network_namespace:
            _without_network_namespace()
        results.put(asyncio.run(_wave(sandboxes, barrier)))
    except BaseException as exc:
        barrier.abort()
        results.put(f"{type(exc).__name__}: {exc}")


async def _wave(sandboxes: int, barrier: Any) -> tuple[float, list[float]]:
    config = deployment("local", None)
    first = built(config, "capacity-warm")  # boots and probes this process's fork server: not measured
    await first.start()
    await first.close()
    barrier.wait(WAIT_S)
    began = time.monotonic()
    boxes = [built(config, f"capacity{i}") for i in range(sandboxes)]
    walls: list[float] = []

    async def start(box: Any) -> None:
        asked = time.monotonic()
        await box.start()
        walls.append(time.monotonic() - asked)
    try:
        await asyncio.gather(*(start(box) for box in boxes))
        return time.monotonic() - began, walls
    finally:
        await asyncio.gather(*(box.close() for box in boxes), return_exceptions=True)


def start_capacity(fork_servers: int, sandboxes: int, no_network_namespace: bool = False) -> dict[str, float]:
    """`sandboxes` started at once across `fork_servers` processes: when the last was ready (s), starts a second
    machine-wide, start p50 and p95 (ms)."""
    context = multiprocessing.get_context("fork")
    each = max(1, sandboxes // fork_servers)
    barrier, results = context.Barrier(fork_servers + 1), context.Queue()
    workers = [context.Process(target=_start_wave, args=(each, no_network_namespace, barrier, results))
               for _ in range(fork_servers)]
    for worker in workers:
        worker.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a process failed: its answer says what
        barrier.wait(WAIT_S)
    answers = [results.get(timeout=WAIT_S) for _ in workers]
    for worker in workers:
        worker.join()
    failed = [answer for answer in answers if isinstance(answer, str)]
    if failed:
        raise RuntimeError(f"a start wave's process failed: {failed[0]}")
    ready_s = max(ready for ready, _ in answers)
    walls = sorted(wall for _, per_process in answers for wall in per_process)
    return {"sandboxes": len(walls), "ready_s": ready_s, "per_s": len(walls) / ready_s,
            "p50_ms": 1000 * walls[len(walls) // 2], "p95_ms": 1000 * walls[min(len(walls) - 1, int(len(walls) * .95))]}


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected whole numbers separated by commas, got {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"each count must be 1 or more, got {text!r}")
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.start_capacity",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--fork-servers", type=_counts, default=[1, max(1, len(os.sched_getaffinity(0)) * 3 // 4)],
                        help="counts of fork servers (processes) to measure, e.g. 1,12 (default: 1 and 3/4 of the "
                             "usable CPUs)")
    parser.add_argument("--sandboxes", type=int, default=256, help="sandboxes in each wave, shared by its processes")
    parser.add_argument("--without-network-namespace", action="store_true",
                        help="also measure each count with sandboxes that share their fork server's network "
                             "namespace (an experiment: what the namespace costs)")
    parser.add_argument("--kernel", action="store_true", help="first time bare unshare(2) by namespace kind")
    args = parser.parse_args(argv)
    cpus = len(os.sched_getaffinity(0))
    if args.kernel:
        print(f"unshare(2), {UNSHARES_PER_PROCESS} per process (a fork that unshares and exits), {cpus} usable CPUs:")
        for kind, flags in NAMESPACES.items():
            for processes in args.fork_servers:
                rate = kernel_rate(flags, processes)
                said = "not permitted here" if rate is None else f"{rate:7.0f} a second machine-wide"
                print(f"  {kind:>22}, {processes:3d} processes at once: {said}", flush=True)
                time.sleep(SETTLE_S)
    print(f"local sandboxes, {args.sandboxes} started at once in each wave, {cpus} usable CPUs:")
    for no_network_namespace in (False, True) if args.without_network_namespace else (False,):
        for count in args.fork_servers:
            f = start_capacity(count, args.sandboxes, no_network_namespace)
            kind = "without their own network namespace" if no_network_namespace else "as a run starts them"
            print(f"  {kind}, {count:3d} fork server(s) x {f['sandboxes'] // count}: all ready in {f['ready_s']:.2f} s "
                  f"({f['per_s']:.0f} a second machine-wide), start p50 {f['p50_ms']:.0f} ms, p95 {f['p95_ms']:.0f} ms",
                  flush=True)
            time.sleep(SETTLE_S)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
