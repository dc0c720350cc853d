"""One container image, two ways to run it: podman, and the local sandbox over the image's unpacked root filesystem.

`uni-agent bench --image-starts IMAGE` (IMAGE: an image podman has, e.g. the tests' `python tests/container_image.py`)
saves the image as an OCI archive once, then measures, in one invocation on one machine, for each backend:
- first start: local, with an empty image cache (the unpack included); podman, its first `run` of the image;
- later starts: p50/p95 of `starts` sandbox starts (start to first command answered), one at a time;
- `true` round trip p50/p95 over `commands` calls in one live sandbox;
- disk per sandbox: what each of `live` idle sandboxes holds on disk of its own, averaged (local: the blocks of its
  sandbox dir, the overlay's upper layers included; podman: the container's writable layer, `SizeRw`); and the
  unpacked image's size, which every local sandbox on the node shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from .measure import percentile
from .sandbox_rtt import TASK


def _disk_bytes(box: Any) -> int:
    """Bytes on disk that belong to this sandbox alone."""
    if getattr(box, "dir", None) is not None:  # local: its dir on the host (the overlay's upper and work dirs)
        total = 0
        for root, _, files in os.walk(box.dir):
            for name in files:
                with contextlib.suppress(OSError):
                    total += os.lstat(os.path.join(root, name)).st_blocks * 512
        return total
    out = subprocess.run(["podman", "container", "inspect", "--size", "--format", "{{.SizeRw}}", box.name],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip() or 0)


async def _measure(config: Any, starts: int, commands: int, live: int) -> dict[str, Any]:
    from uni_agent.sandbox import make_sandbox

    async def start_one(i: int) -> tuple[Any, float]:
        box = make_sandbox(config, {}, f"imgbench{i}")
        t0 = time.perf_counter()
        await box.start()
        return box, time.perf_counter() - t0

    box, first = await start_one(0)
    try:
        for _ in range(20):
            await box.exec("true", 30)
        trips = []
        for _ in range(commands):
            t0 = time.perf_counter()
            await box.exec("true", 30)
            trips.append(time.perf_counter() - t0)
    finally:
        await box.close()
    later = []
    for i in range(starts):
        one, seconds = await start_one(i + 1)
        later.append(seconds)
        await one.close()
    boxes = []
    try:
        for i in range(live):
            boxes.append((await start_one(100 + i))[0])
            await boxes[-1].exec("true", 30)
        disk = statistics.fmean([await asyncio.to_thread(_disk_bytes, b) for b in boxes])
    finally:
        await asyncio.gather(*(b.close() for b in boxes))
    return {"first_start_s": first, "start_p50_s": statistics.median(later), "start_p95_s": percentile(later, 0.95),
            "rtt_p50_ms": 1000 * statistics.median(trips), "rtt_p95_ms": 1000 * percentile(trips, 0.95),
            "disk_mib_per_sandbox": disk / 2**20}


def compare(image: str, starts: int = 20, commands: int = 300, live: int = 8) -> list[str]:
    from uni_agent.config import ContainerDeploymentConfig, LocalDeploymentConfig
    from uni_agent.sandbox.image_store import ImageStore

    with tempfile.TemporaryDirectory(prefix="uni-agent-image-bench.") as tmp:
        archive = Path(tmp) / "image.tar"
        subprocess.run(["podman", "save", "--quiet", "--format", "oci-archive", "-o", str(archive), image], check=True)
        os.environ["UNI_AGENT_IMAGE_CACHE"] = str(Path(tmp) / "cache")  # empty: the first start unpacks
        local = asyncio.run(_measure(LocalDeploymentConfig(image=f"oci-archive:{archive}", repo=f"bundled:{TASK}"),
                                     starts, commands, live))
        unpacked = ImageStore(Path(tmp) / "cache").images()
        podman = asyncio.run(_measure(ContainerDeploymentConfig(type="podman", image=image, pull="never",
                                                                repo=f"bundled:{TASK}"),
                                      starts, commands, live))
    size = sum(s for _, s, _ in unpacked) / 2**20
    lines = [f"image {image}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {starts} later starts, "
             f"{commands} `true` calls, disk over {live} live sandboxes; local's unpacked image {size:.0f} MiB "
             "(once per node, shared)",
             f"  {'backend':<22} {'first start':>11} {'start p50':>10} {'start p95':>10} {'true p50':>9} "
             f"{'true p95':>9} {'disk/sandbox':>13}"]
    for name, f in (("local over the image", local), ("podman (runc)", podman)):
        lines.append(f"  {name:<22} {f['first_start_s']:>10.2f}s {f['start_p50_s']:>9.3f}s {f['start_p95_s']:>9.3f}s "
                     f"{f['rtt_p50_ms']:>7.2f}ms {f['rtt_p95_ms']:>7.2f}ms {f['disk_mib_per_sandbox']:>10.2f} MiB")
    return lines
