"""The sandbox alone: `true` round trip in a live sandbox, machine CPU per command, memory per live sandbox.

It uses only the public sandbox API (a deployment's `build`, `exec`, `close`; an older tree's `make_sandbox` and
configs in uni_agent.config), so the same file measures an older checkout:
`uni-agent bench sandbox --baseline REF` runs it once against a git worktree of REF (PYTHONPATH) and once against
this tree, in one invocation on the same machine, and prints both side by side. Run as a script it prints one JSON
object: `python -m uni_agent.bench.sandbox_rtt --backend local --commands 500 --sandboxes 32`.

Figures:
- round trip: wall time of `exec("true")` as the caller sees it, p50/p95 over `commands` calls, one sandbox.
- machine CPU per command: the whole machine's user+system CPU (/proc/stat) over those calls, divided by their number
  (everything a command costs: this process, the supervisor or the per-command process chain, the kernel).
- memory per live sandbox: MemAvailable before minus after starting `sandboxes` sandboxes (and running one command in
  each), divided by their number: supervisor, bwrap, holders, page tables, the overlay's dentries, whatever it is.
- start: `starts` sandboxes started, given one `true` and closed, one after another: wall p50 of the start, and the
  CPU of the whole cycle per sandbox (what a wave of sandboxes costs the machine).
- close after writes: `write_sandboxes` sandboxes each write `write_mib` MiB to their workspace (no sync), then close
  all at once: wall time until the last close returned. A workspace overlay whose unmount syncs its filesystem waits
  for the disk here; a volatile one (Linux 5.10 on) drops what the sandbox wrote.
- a wave: `wave_sandboxes` sandboxes started at once, each given `echo hello && ls`, closed at once (the rollout
  bench's first and last moments): this process's own CPU (rusage: its threads, not its children) per sandbox, what
  an agent worker pays for each sandbox it opens and closes, and the wall time of the three steps.
- own CPU: where this process can make a cgroup v1 cpuacct group of its own (root), the CPU per command and per start
  is read from it as well: this process and everything it started, orphans included (bwrap's children outlive their
  parent and rusage loses them), and nothing of what else runs on the machine. Elsewhere those columns are "-".
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

CPUACCT = "/sys/fs/cgroup/cpuacct"  # cgroup v1; on v2 the sandboxes' pids cgroups would take them out of ours


TASK = "uni-agent__romanum-4"  # the bundled task the rollout bench uses too (bench/ours.py)


def machine_cpu_seconds() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def own_cgroup_cpu() -> Callable[[], float] | None:
    """CPU seconds of this process and all it starts from now on, from a cpuacct cgroup made for it (left at exit);
    None where none can be made. Self-contained: this file runs against older trees (--baseline)."""
    group = os.path.join(CPUACCT, f"uni-agent-bench-{os.getpid()}")
    try:
        os.mkdir(group)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        with contextlib.suppress(OSError):
            os.rmdir(group)
        return None

    def leave() -> None:
        with contextlib.suppress(OSError):
            with open(os.path.join(CPUACCT, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            os.rmdir(group)  # fails while a child is still in it; the kernel keeps an empty group harmlessly

    atexit.register(leave)

    def read() -> float:
        with open(os.path.join(group, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9

    return read


def deployment(backend: str, image: str | None) -> Any:
    try:  # each backend's config beside it
        from uni_agent.sandbox.container import ContainerDeploymentConfig
        from uni_agent.sandbox.local import LocalDeploymentConfig
    except ImportError:  # an older tree (--baseline): every config in uni_agent.config
        from uni_agent.config import ContainerDeploymentConfig, LocalDeploymentConfig

    if backend == "local":
        return LocalDeploymentConfig(repo=f"bundled:{TASK}")
    return ContainerDeploymentConfig(type=backend, image=image, pull="never", repo=f"bundled:{TASK}")


def built(config: Any, name: str) -> Any:
    """The deployment's sandbox, not started: its `build`, or an older tree's make_sandbox."""
    if hasattr(config, "build"):
        return config.build({}, name)
    from uni_agent.sandbox import make_sandbox

    return make_sandbox(config, {}, name)


async def measure(backend: str, image: str | None, commands: int, sandboxes: int, starts: int = 30,
                  own_cpu: Callable[[], float] | None = None, write_sandboxes: int = 8,
                  write_mib: int = 64, wave_sandboxes: int = 256) -> dict[str, Any]:
    config = deployment(backend, image)
    own = own_cpu or (lambda: float("nan"))
    box = built(config, "rtt")
    t0 = time.monotonic()
    await box.start()
    first_start_s = time.monotonic() - t0
    try:
        for _ in range(20):  # warm up: caches, the first command's state
            await box.exec("true", 30)
        round_trips = []
        cpu0, own0 = machine_cpu_seconds(), own()
        for _ in range(commands):
            started = time.perf_counter()
            result = await box.exec("true", 30)
            round_trips.append(time.perf_counter() - started)
            if result.exit_code != 0:
                raise RuntimeError(f"`true` failed in the sandbox: {result}")
        cpu_per_command = (machine_cpu_seconds() - cpu0) / commands
        own_per_command = (own() - own0) / commands
    finally:
        await box.close()
    start_walls = []
    cpu0, own0 = machine_cpu_seconds(), own()
    for i in range(starts):
        one = built(config, f"start{i}")
        t0 = time.monotonic()
        await one.start()
        start_walls.append(time.monotonic() - t0)
        try:
            await one.exec("true", 30)
        finally:
            await one.close()
    cpu_per_start = (machine_cpu_seconds() - cpu0) / max(starts, 1)
    own_per_start = (own() - own0) / max(starts, 1)
    round_trips.sort()
    memory_per_sandbox = None
    if sandboxes:
        await asyncio.sleep(0.5)
        before = mem_available_bytes()
        boxes = [built(config, f"mem{i}") for i in range(sandboxes)]
        try:
            for one in boxes:  # one after another: the figure is memory, not start throughput
                await one.start()
                await one.exec("true", 30)
            await asyncio.sleep(0.5)
            memory_per_sandbox = (before - mem_available_bytes()) / sandboxes
        finally:
            await asyncio.gather(*(one.close() for one in boxes))
    close_after_write_s = await close_after_writes(config, write_sandboxes, write_mib) if write_sandboxes else None
    wave = await wave_cost(config, wave_sandboxes) if wave_sandboxes else None
    return {
        "backend": backend,
        "commands": commands,
        "start_s": round(first_start_s, 4),
        "rtt_p50_ms": round(1000 * round_trips[len(round_trips) // 2], 3),
        "rtt_p95_ms": round(1000 * round_trips[int(len(round_trips) * 0.95)], 3),
        "rtt_mean_ms": round(1000 * statistics.fmean(round_trips), 3),
        "machine_cpu_ms_per_command": round(1000 * cpu_per_command, 3),
        "sandboxes": sandboxes,
        "memory_mib_per_sandbox": None if memory_per_sandbox is None else round(memory_per_sandbox / 2**20, 2),
        "starts": starts,
        "start_p50_ms": round(1000 * statistics.median(start_walls), 2) if start_walls else None,
        "machine_cpu_ms_per_start": round(1000 * cpu_per_start, 2),
        "own_cpu_ms_per_command": None if own_cpu is None else round(1000 * own_per_command, 3),
        "own_cpu_ms_per_start": None if own_cpu is None else round(1000 * own_per_start, 2),
        "write_sandboxes": write_sandboxes,
        "write_mib": write_mib,
        "close_after_write_ms": None if close_after_write_s is None else round(1000 * close_after_write_s, 1),
        "wave_sandboxes": wave_sandboxes,
        "wave_process_cpu_ms_per_sandbox": None if wave is None else round(1000 * wave[0], 2),
        "wave_s": None if wave is None else round(wave[1], 2),
    }


async def started_and_ran(config: Any, sandboxes: int, prefix: str, command: str, timeout: float,
                          what: str) -> list[Any]:
    """`sandboxes` sandboxes started at once, then each given `command` at once; all closed again if a step fails
    (`what` names the command in the error)."""
    boxes = [built(config, f"{prefix}{i}") for i in range(sandboxes)]
    try:
        await asyncio.gather(*(one.start() for one in boxes))
        ran = await asyncio.gather(*(one.exec(command, timeout) for one in boxes))
        failed = [result for result in ran if result.exit_code != 0]
        if failed:
            raise RuntimeError(f"{what} in a sandbox failed: {failed[0].output[-500:]}")
    except BaseException:
        await asyncio.gather(*(one.close() for one in boxes), return_exceptions=True)
        raise
    return boxes


async def wave_cost(config: Any, sandboxes: int) -> tuple[float, float]:
    """(this process's CPU seconds per sandbox, wall seconds) for `sandboxes` started at once, given one command
    each, closed at once. time.process_time: every thread of this process, none of its children."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    boxes = await started_and_ran(config, sandboxes, "wave", "echo hello && ls", 60, "`echo hello && ls`")
    await asyncio.gather(*(one.close() for one in boxes))
    return (time.process_time() - cpu0) / sandboxes, time.monotonic() - wall0


async def close_after_writes(config: Any, sandboxes: int, mib: int) -> float:
    """Seconds to close `sandboxes` sandboxes at once, each having written `mib` MiB (left in the page cache)."""
    boxes = await started_and_ran(config, sandboxes, "write", f"dd if=/dev/zero of=written bs=1M count={mib} "
                                  "status=none", 300, f"writing {mib} MiB")
    started = time.monotonic()
    await asyncio.gather(*(one.close() for one in boxes))
    return time.monotonic() - started


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.sandbox_rtt")
    parser.add_argument("--backend", default="local", choices=["local", "podman", "docker"])
    parser.add_argument("--image", default=None, help="the container image (podman/docker)")
    parser.add_argument("--commands", type=int, default=500)
    parser.add_argument("--sandboxes", type=int, default=32, help="live sandboxes for the memory figure (0: skip)")
    parser.add_argument("--starts", type=int, default=30, help="start-true-close cycles one after another")
    parser.add_argument("--write-sandboxes", type=int, default=8,
                        help="sandboxes that write, then close at once, for the close figure (0: skip)")
    parser.add_argument("--write-mib", type=int, default=64, help="MiB each of them writes")
    parser.add_argument("--wave-sandboxes", type=int, default=256,
                        help="sandboxes started, given a command and closed at once, for the wave figure (0: skip)")
    args = parser.parse_args(argv)
    own_cpu = own_cgroup_cpu()  # before anything starts, so all of it is counted
    figures = asyncio.run(measure(args.backend, args.image, args.commands, args.sandboxes, args.starts, own_cpu,
                                  args.write_sandboxes, args.write_mib, args.wave_sandboxes))
    json.dump(figures, sys.stdout)
    print()


if __name__ == "__main__":
    main()
