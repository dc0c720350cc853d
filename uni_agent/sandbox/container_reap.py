"""uni-agent's containers found and removed by their labels: every sandbox container carries `uni-agent.sandbox=1`,
its creation time and its owner (`<host>:<pid>`). `remove_containers` is how a sandbox removes its own container
(container.py) and how `reap` removes the leftovers of a process that was killed;
`python -m uni_agent.sandbox.container reap [--cli podman] [--older-than SECONDS]` runs `reap`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Sequence
from pathlib import Path

import structlog

from .base import SandboxError

log = structlog.get_logger("uni_agent.sandbox")

LABEL = "uni-agent.sandbox"
CREATED_LABEL = "uni-agent.created"
OWNER_LABEL = "uni-agent.owner"  # <hostname>:<pid> of the process that started it


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


async def remove_containers(cli: str, names: Sequence[str], global_args: Sequence[str] = (),
                            env: dict[str, str] | None = None, attempts: int = 3) -> bool:
    """`rm -f` the containers (podman: without the 10 s stop grace). Not killed when the caller is cancelled: once
    started, the removal runs to its end. True when none of them is left."""
    if not names:
        return True
    force = ["rm", "-f", "-t", "0"] if Path(cli).name == "podman" else ["rm", "-f"]
    for attempt in range(attempts):
        proc = await asyncio.create_subprocess_exec(
            cli, *global_args, *force, *names, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env=env,
        )
        _, err = await asyncio.shield(proc.communicate())
        gone = proc.returncode == 0 or all(_no_such_container(err, n) for n in names)
        if gone:
            return True
        log.warning("container_rm_failed", names=list(names), attempt=attempt + 1, error=cli_text(err))
    return False


def _no_such_container(err: bytes, name: str) -> bool:
    text = err.decode("utf-8", "replace").lower()
    return name.lower() in text and ("no such container" in text or "no container with name" in text)


async def list_containers(cli: str = "podman", older_than_s: float = 0.0, skip_live_owners: bool = False
                          ) -> list[str]:
    """Names of the containers labelled as uni-agent sandboxes created more than `older_than_s` seconds ago;
    with `skip_live_owners`, not those whose owner is a process still running on this host."""
    proc = await asyncio.create_subprocess_exec(
        cli, "ps", "-a", "--filter", f"label={LABEL}=1", "--format", "{{.Names}}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise SandboxError(f"{cli} ps failed: {cli_text(err)}")
    names = out.decode().split()
    if not names:
        return names
    fmt = f'{{{{.Name}}}} {{{{index .Config.Labels "{CREATED_LABEL}"}}}} {{{{index .Config.Labels "{OWNER_LABEL}"}}}}'
    proc = await asyncio.create_subprocess_exec(cli, "inspect", "--format", fmt, *names,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()  # a container that vanished meanwhile is simply missing from the output
    cutoff = time.time() - older_than_s
    host = socket.gethostname()
    found = []
    for line in out.decode().splitlines():
        name, created, owner = (line.strip().split(" ") + ["", ""])[:3]
        if not name or not created.isdigit() or int(created) > cutoff:
            continue
        owner_host, _, owner_pid = owner.rpartition(":")
        if skip_live_owners and owner_host == host and owner_pid.isdigit() and _alive(int(owner_pid)):
            continue
        found.append(name.lstrip("/"))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def reap(cli: str = "podman", older_than_s: float = 3600.0, skip_live_owners: bool = True) -> list[str]:
    """Remove leftover uni-agent containers older than `older_than_s` (e.g. from a process that was killed); by
    default not those whose owner process is still running on this host."""
    names = await list_containers(cli, older_than_s, skip_live_owners)
    if names and not await remove_containers(cli, names):
        raise SandboxError(f"could not remove all of {names}")
    return names


def cli_text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace").strip()[-2000:]


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m uni_agent.sandbox.container reap [--cli podman] [--older-than SECONDS]`"""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m uni_agent.sandbox.container")
    sub = parser.add_subparsers(dest="command", required=True)
    reap_cmd = sub.add_parser("reap", help="remove leftover uni-agent sandbox containers")
    reap_cmd.add_argument("--cli", default="podman", help="docker or podman (or a path to either)")
    reap_cmd.add_argument("--older-than", type=float, default=3600.0, help="seconds since creation (default 3600)")
    reap_cmd.add_argument("--include-live-owners", action="store_true",
                          help="also remove containers whose owner process on this host is still running")
    args = parser.parse_args(argv)
    removed = asyncio.run(reap(args.cli, args.older_than, skip_live_owners=not args.include_live_owners))
    print(f"removed {len(removed)} container(s)" + (f": {' '.join(removed)}" if removed else ""))
