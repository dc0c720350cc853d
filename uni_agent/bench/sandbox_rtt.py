"""The sandbox alone: `true` round trip in a live sandbox, machine CPU per command, memory per live sandbox.

It uses only the public sandbox API (`make_sandbox`, `exec`, `close`), so the same file measures an older checkout:
`uni-agent bench sandbox --baseline REF` runs it once against a git worktree of REF (PYTHONPATH) and once against
this tree, in one invocation on the same machine, and prints both side by side. Run as a script it prints one JSON
object: `python -m uni_agent.bench.sandbox_rtt --backend local --commands 500 --sandboxes 32`.

Figures:
- round trip: wall time of `exec("true")` as the caller sees it, p50/p95 over `commands` calls, one sandbox.
- machine CPU per command: the whole machine's user+system CPU (/proc/stat) over those calls, divided by their number
  (everything a command costs: this process, the supervisor or the per-command process chain, the kernel).
- memory per live sandbox: MemAvailable before minus after starting `sandboxes` sandboxes (and running one command in
  each), divided by their number: supervisor, bwrap, holders, page tables, the overlay's dentries, whatever it is.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from typing import Any


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


def deployment(backend: str, image: str | None) -> Any:
    from uni_agent.config import ContainerDeploymentConfig, LocalDeploymentConfig

    if backend == "local":
        return LocalDeploymentConfig(repo=f"bundled:{TASK}")
    return ContainerDeploymentConfig(type=backend, image=image, pull="never", repo=f"bundled:{TASK}")


async def measure(backend: str, image: str | None, commands: int, sandboxes: int) -> dict[str, Any]:
    from uni_agent.sandbox import make_sandbox

    config = deployment(backend, image)
    box = make_sandbox(config, {}, "rtt")
    t0 = time.monotonic()
    await box.start()
    first_start_s = time.monotonic() - t0
    try:
        for _ in range(20):  # warm up: caches, the first command's state
            await box.exec("true", 30)
        round_trips = []
        cpu0 = machine_cpu_seconds()
        for _ in range(commands):
            started = time.perf_counter()
            result = await box.exec("true", 30)
            round_trips.append(time.perf_counter() - started)
            if result.exit_code != 0:
                raise RuntimeError(f"`true` failed in the sandbox: {result}")
        cpu_per_command = (machine_cpu_seconds() - cpu0) / commands
    finally:
        await box.close()
    round_trips.sort()
    memory_per_sandbox = None
    if sandboxes:
        await asyncio.sleep(0.5)
        before = mem_available_bytes()
        boxes = [make_sandbox(config, {}, f"mem{i}") for i in range(sandboxes)]
        try:
            for one in boxes:  # one after another: the figure is memory, not start throughput
                await one.start()
                await one.exec("true", 30)
            await asyncio.sleep(0.5)
            memory_per_sandbox = (before - mem_available_bytes()) / sandboxes
        finally:
            await asyncio.gather(*(one.close() for one in boxes))
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
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.sandbox_rtt")
    parser.add_argument("--backend", default="local", choices=["local", "podman", "docker"])
    parser.add_argument("--image", default=None, help="the container image (podman/docker)")
    parser.add_argument("--commands", type=int, default=500)
    parser.add_argument("--sandboxes", type=int, default=32, help="live sandboxes for the memory figure (0: skip)")
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.backend, args.image, args.commands, args.sandboxes))
    json.dump(figures, sys.stdout)
    print()


if __name__ == "__main__":
    main()
