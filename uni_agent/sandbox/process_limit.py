"""A cap on the number of processes of one local sandbox, so that a fork bomb stays inside it.

RLIMIT_NPROC (`ulimit -u`) does not bind root, and bwrap keeps the caller's uid outside its user namespace, so for a
worker running as root the limit must come from a pids cgroup: each sandbox gets its own cgroup with `pids.max`, and
every command of the sandbox joins it before it execs anything. Where no pids cgroup is writable (a worker without
root, a read-only /sys/fs/cgroup), the sandbox falls back to `ulimit -u`, which does bind a non-root user.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from pathlib import Path

import structlog

log = structlog.get_logger("uni_agent.sandbox")

PARENT_NAME = "uni-agent"
# cgroup v1 mounts the pids controller on its own; a pure cgroup2 system has one hierarchy at /sys/fs/cgroup.
CANDIDATE_MOUNTS = (Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup"))
# `sh` writes its own pid into the cgroup, then becomes the command: everything the command starts is counted.
JOIN_SCRIPT = 'echo $$ > "$0" && exec "$@"'


def _is_cgroup2(mount: Path) -> bool:
    return (mount / "cgroup.subtree_control").exists()


def pids_cgroup_parent(quiet: bool = False) -> Path | None:
    """The cgroup under which sandboxes get theirs, or None where none can be made (said once in the log unless
    `quiet`: the fork server's warm-up at a worker's start, before a run's logs exist; its probe is the one the
    first sandbox then reuses).

    UNI_AGENT_PIDS_CGROUP=off turns cgroups off (ulimit fallback); any other value names the mount to use."""
    parent = probed_pids_cgroup_parent()
    if parent is None and not quiet and os.environ.get("UNI_AGENT_PIDS_CGROUP", "") != "off":
        _say_no_pids_cgroup()
    return parent


@functools.cache
def probed_pids_cgroup_parent() -> Path | None:
    """pids_cgroup_parent's probe, once per process (`cache_clear()` to probe again)."""
    setting = os.environ.get("UNI_AGENT_PIDS_CGROUP", "")
    if setting == "off":
        return None
    for mount in (Path(setting),) if setting else CANDIDATE_MOUNTS:
        if not (mount / "cgroup.procs").exists():
            continue
        if _is_cgroup2(mount) and "pids" not in (mount / "cgroup.subtree_control").read_text().split():
            continue  # cgroup2 without the pids controller delegated here
        parent = mount / PARENT_NAME
        probe = parent / f"probe-{os.getpid()}"
        try:
            parent.mkdir(exist_ok=True)
            if _is_cgroup2(mount):
                (parent / "cgroup.subtree_control").write_text("+pids")
            probe.mkdir(exist_ok=True)
            usable = (probe / "pids.max").exists()
            probe.rmdir()
        except OSError:
            continue
        if usable:
            return parent
    return None


@functools.cache
def _say_no_pids_cgroup() -> None:
    if os.geteuid() == 0:
        log.warning("no_pids_cgroup", detail="local sandboxes fall back to `ulimit -u`, which does not bind root")
    else:  # the usual case for an ordinary user, and `ulimit -u` binds one
        log.info("no_pids_cgroup", detail="local sandboxes cap their processes with `ulimit -u`")


class ProcessLimit:
    """The process cap of one sandbox: a pids cgroup where possible, else a `ulimit -u` line for its shell."""

    def __init__(self, name: str, max_processes: int | None):
        self.max_processes = max_processes
        parent = pids_cgroup_parent() if max_processes else None
        # Named after the owning process: cgroups are machine-wide, so a dead owner's can be found and removed
        # whatever sandbox root its sandboxes used.
        self.cgroup: Path | None = parent / f"{os.getpid()}-{name}" if parent else None

    @property
    def mode(self) -> str:
        if not self.max_processes:
            return "none"
        return "cgroup" if self.cgroup else "ulimit"

    def create(self) -> None:
        if self.cgroup is None:
            return
        self.cgroup.mkdir(exist_ok=True)
        (self.cgroup / "pids.max").write_text(str(self.max_processes))

    def command_prefix(self) -> list[str]:
        """Put in front of a command's argv: it joins the cgroup before it runs."""
        if self.cgroup is None:
            return []
        return ["sh", "-c", JOIN_SCRIPT, str(self.cgroup / "cgroup.procs")]

    def shell_limit(self) -> str:
        """A line for the sandbox shell, where no cgroup holds the limit (binds non-root users only)."""
        return f"ulimit -u {self.max_processes} 2>/dev/null;" if self.mode == "ulimit" else ""

    def processes(self) -> list[int]:
        if self.cgroup is None:
            return []
        try:
            return [int(pid) for pid in (self.cgroup / "cgroup.procs").read_text().split()]
        except OSError:
            return []

    def peak(self) -> int | None:
        """The most processes the sandbox ever ran at once, where the kernel keeps count (pids.peak)."""
        with contextlib.suppress(OSError, ValueError, TypeError):
            return int((self.cgroup / "pids.peak").read_text())  # type: ignore[operator]
        return None

    def remove(self, timeout: float = 10.0) -> None:
        """Kill whatever still runs in the cgroup (a fork bomb's stragglers), then remove it."""
        if self.cgroup is not None:
            remove_cgroup(self.cgroup, timeout)


def remove_cgroup(cgroup: Path, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while cgroup.exists():
        with contextlib.suppress(OSError):
            for pid in (cgroup / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:  # still busy: its processes are dying
            if time.monotonic() > deadline:
                log.warning("cgroup_not_removed", cgroup=str(cgroup))
                return
            time.sleep(0.02)


def reap_orphaned_cgroups() -> list[Path]:
    """Remove the cgroups of sandboxes whose owning process is gone (a worker killed with -9). Their processes died
    with the owner (bwrap --die-with-parent); what is left is an empty cgroup."""
    parent = pids_cgroup_parent()
    if parent is None:
        return []
    removed = []
    alive: dict[str, bool] = {}
    # Plain names, no stat per entry: this runs at every sandbox start, with up to a thousand cgroups listed. Only
    # our sandboxes' cgroups start with digits (the controller's files are cgroup.*, pids.*, tasks, ...).
    for name in os.listdir(parent):
        owner, _, rest = name.partition("-")
        if not (owner.isdigit() and rest):
            continue  # the probe, or a controller file
        if owner not in alive:
            alive[owner] = os.path.exists(f"/proc/{owner}")
        if not alive[owner]:
            remove_cgroup(parent / name)
            removed.append(parent / name)
    return removed
