"""One container image, several ways to run it: the local sandbox over the image's unpacked root filesystem (as the
user running the bench, and, with a rootless user named, as that ordinary user too), and podman.

`uni-agent bench --image-starts IMAGE [--rootless-user USER]` (IMAGE: an image podman has, e.g. the tests'
`python tests/container_image.py`) saves the image as an OCI archive once, then measures, in one invocation on one
machine, for each way:
- first start: local, with an empty image cache (the unpack included); podman, its first `run` of the image;
- later starts: p50/p95 of `starts` sandbox starts (start to first command answered), one at a time;
- `true` round trip p50/p95 over `commands` calls in one live sandbox;
- disk per sandbox: what each of `live` idle sandboxes holds on disk of its own, averaged (local: `du` of its
  sandbox dir, the overlay's upper layers included; podman: the container's writable layer, `SizeRw`); and the
  unpacked image's size, which every local sandbox on the node shares.
With `--rootless-user` (the bench run as root), the same local figures as that user, through `runuser`, in its own
user namespace (sandbox/userns.py), with its own image cache: once as it starts by default (the overlay), once with
`workspace: copy`, which is what a start without root did before the user namespace (fewer starts and sandboxes:
each copies the whole image).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from .measure import percentile
from .sandbox_rtt import TASK


def _disk_bytes(box: Any) -> int:
    """Bytes on disk that belong to this sandbox alone."""
    if getattr(box, "dir", None) is not None:  # local: its dir on the host (the overlay's upper and work dirs)
        from uni_agent.sandbox.userns import user_namespace

        # Without root, from inside its user namespace: the caller cannot enter what the image's User owns.
        namespace = user_namespace()
        inside = namespace.argv(mount=False) if namespace is not None else []
        out = subprocess.run([*inside, "du", "-s", "-B1", str(box.dir)], capture_output=True, text=True,
                             check=True).stdout
        return int(out.split()[0])
    out = subprocess.run(["podman", "container", "inspect", "--size", "--format", "{{.SizeRw}}", box.name],
                         capture_output=True, text=True, check=True).stdout
    return int(out.strip() or 0)


async def _measure(config: Any, starts: int, commands: int, live: int) -> dict[str, Any]:
    async def start_one(i: int) -> tuple[Any, float]:
        box = config.build({}, f"imgbench{i}")
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


def _measure_as(user: str, image: str, workspace: str, cache: Path, starts: int, commands: int,
                live: int) -> dict[str, Any]:
    """The local figures measured by `user` (an ordinary user; we are root), in a process of its own."""
    entry = pwd.getpwnam(user)
    cache.mkdir(exist_ok=True)
    os.chown(cache, entry.pw_uid, entry.pw_gid)
    env = [f"HOME={entry.pw_dir}", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
           f"UNI_AGENT_IMAGE_CACHE={cache}"]
    argv = ["runuser", "-u", user, "--", "env", "-i", *env, sys.executable, "-m", "uni_agent.bench.image_start",
            "--image", image, "--workspace", workspace, "--starts", str(starts), "--commands", str(commands),
            "--live", str(live)]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=entry.pw_dir)
    if done.returncode != 0:
        raise RuntimeError(f"the rootless measurement as {user} failed: {(done.stderr or done.stdout)[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def compare(image: str, starts: int = 20, commands: int = 300, live: int = 8,
            rootless_user: str | None = None) -> list[str]:
    from uni_agent.sandbox.container import ContainerDeploymentConfig
    from uni_agent.sandbox.image_store import ImageStore
    from uni_agent.sandbox.local import LocalDeploymentConfig

    if rootless_user is not None:
        if os.geteuid() != 0:
            raise SystemExit("--rootless-user needs the bench to run as root (it measures both, as root and as USER)")
        try:
            pwd.getpwnam(rootless_user)
        except KeyError:
            raise SystemExit(f"--rootless-user {rootless_user}: no such user (useradd -m {rootless_user})") from None
    who = "root" if os.geteuid() == 0 else "rootless"
    rows = []
    with tempfile.TemporaryDirectory(prefix="uni-agent-image-bench.") as tmp:
        archive = Path(tmp) / "image.tar"
        subprocess.run(["podman", "save", "--quiet", "--format", "oci-archive", "-o", str(archive), image], check=True)
        os.environ["UNI_AGENT_IMAGE_CACHE"] = str(Path(tmp) / "cache")  # empty: the first start unpacks
        reference = f"oci-archive:{archive}"
        rows.append((f"local, {who}", asyncio.run(_measure(LocalDeploymentConfig(image=reference,
                                                                                 repo=f"bundled:{TASK}"),
                                                           starts, commands, live))))
        unpacked = ImageStore(Path(tmp) / "cache").images()
        if rootless_user is not None:
            os.chmod(tmp, 0o755)  # the user reads the archive; root's cache in it stays root's
            os.chmod(archive, 0o644)
            cache = Path(tmp) / "cache-rootless"
            rows.append((f"local, rootless ({rootless_user})",
                         _measure_as(rootless_user, reference, "auto", cache, starts, commands, live)))
            rows.append(("local, rootless, copy", _measure_as(rootless_user, reference, "copy", cache,
                                                              max(3, starts // 4), commands, min(live, 3))))
        rows.append(("podman (runc)", asyncio.run(_measure(
            ContainerDeploymentConfig(type="podman", image=image, pull="never", repo=f"bundled:{TASK}"),
            starts, commands, live))))
    size = sum(s for _, s, _ in unpacked) / 2**20
    lines = [f"image {image}: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}; {starts} later starts, "
             f"{commands} `true` calls, disk over {live} live sandboxes; local's unpacked image {size:.0f} MiB "
             "(once per node and user, shared)"]
    if rootless_user is not None:
        lines.append(f"rootless: as {rootless_user} in its own user namespace, its own image cache (the first start "
                     f"unpacks there); `copy`: workspace: copy, as every start without root did before, "
                     f"{max(3, starts // 4)} later starts and {min(live, 3)} live sandboxes")
    lines.append(f"  {'backend':<32} {'first start':>11} {'start p50':>10} {'start p95':>10} {'true p50':>9} "
                 f"{'true p95':>9} {'disk/sandbox':>13}")
    for name, f in rows:
        lines.append(f"  {name:<32} {f['first_start_s']:>10.2f}s {f['start_p50_s']:>9.3f}s {f['start_p95_s']:>9.3f}s "
                     f"{f['rtt_p50_ms']:>7.2f}ms {f['rtt_p95_ms']:>7.2f}ms {f['disk_mib_per_sandbox']:>10.2f} MiB")
    return lines


def main(argv: list[str] | None = None) -> int:
    """One user's local figures as JSON (what compare runs as the rootless user)."""
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.image_start")
    parser.add_argument("--image", required=True)
    parser.add_argument("--workspace", choices=("auto", "overlay", "copy"), default="auto")
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--commands", type=int, default=300)
    parser.add_argument("--live", type=int, default=8)
    args = parser.parse_args(argv)
    from uni_agent.sandbox.local import LocalDeploymentConfig

    config = LocalDeploymentConfig(image=args.image, repo=f"bundled:{TASK}", workspace=args.workspace)
    print(json.dumps(asyncio.run(_measure(config, args.starts, args.commands, args.live))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
