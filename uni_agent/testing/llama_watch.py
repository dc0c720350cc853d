"""A run's llama-server seen from outside, by its log and /proc: for tests and tours that kill it on purpose."""

from __future__ import annotations

import re
from pathlib import Path


def engine_port(log: Path) -> int | None:
    """The port the server in `log` listens on, once it said so."""
    try:
        found = re.search(r"listening on http://[\d.]+:(\d+)", log.read_text(errors="replace"))
    except OSError:
        return None
    return int(found.group(1)) if found else None


def server_pids(port: int) -> list[int]:
    """llama-server processes serving `port` (other runs on the machine have other ports)."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "llama-server" in cmd and f"--port {port} " in cmd + " ":
            pids.append(int(proc.name))
    return pids


def answered(log: Path) -> int:
    """Model calls the engine finished so far (every run of the server appends to the same log)."""
    return log.read_text(errors="replace").count("stop processing") if log.exists() else 0
