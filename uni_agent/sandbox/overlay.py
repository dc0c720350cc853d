"""Whether a local sandbox's workspace is an overlay: the `workspace` setting, and whether overlayfs can be mounted
here at all (as root, or in a user namespace of the sandbox's own), probed until it first works, then known for the
process. Where none can be mounted, `workspace: auto` copies instead (said once per process, in the log).

SETUP_SCRIPT is what mounts a sandbox's overlays, in its namespaces before bwrap (DURABLE_SETUP_SCRIPT those of
uni_agent.envs' build steps).
"""

from __future__ import annotations

import asyncio
import os
import uuid
import weakref
from pathlib import Path

import structlog

from .private_dir import make_private_subdir
from .base import SandboxError
from .leftovers import OWNER_FILE, remove_sandbox_dir, to_thread_kept
from .userns import UserNamespace

log = structlog.get_logger("uni_agent.sandbox")

_MOUNT = 'mount -t overlay overlay -o "lowerdir=$1,upperdir=$2,workdir=$3{options}" "$4"'


def _setup_script(mount: str) -> str:
    """Run by `sh` in the sandbox's namespaces before bwrap, `mount` mounting one tree. Its arguments: OWNER (uid:gid,
    or empty) and the dirs to give to it, `--`, then lower, upper, work dir and mount point of each copy-on-write tree,
    `--`, then bwrap's argv."""
    return ('owner=$1; shift; while [ "$1" != -- ]; do chown -- "$owner" "$1" || exit 1; shift; done; shift; '
            f'while [ "$1" != -- ]; do {mount} || exit 1; shift 4; done; shift; exec "$@"')


# A sandbox's overlays are `volatile` where the kernel has it (Linux 5.10 on; older ones refuse the option, and get
# the plain mount): the upper layer goes with the sandbox, so no sync of it is worth waiting for (an fsync inside
# returns at once, and the unmount at the sandbox's end no longer syncs the whole filesystem under it to disk).
SETUP_SCRIPT = _setup_script(f"{{ {_MOUNT.format(options=',volatile')} 2>/dev/null || {_MOUNT.format(options='')}; }}")
# A volatile overlay's work dir refuses every later mount: for dirs that may be mounted again (uni_agent.envs' build
# steps keep their scratch dirs), the plain mount.
DURABLE_SETUP_SCRIPT = _setup_script(_MOUNT.format(options=""))

_overlay_works: list[bool] = []  # [True] once an overlay was mounted in this process
# The overlay probe in flight (or its answer) per event loop: tasks cannot be shared across loops (tests run many)
_overlay_probes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[bool]] = weakref.WeakKeyDictionary()
_copy_said: list[bool] = []  # [True] once the fallback to copies was logged


async def overlay_wanted(workspace: str, userns: UserNamespace | None, sandboxes: Path, *, quiet: bool = False) -> bool:
    """Whether a sandbox with this `workspace` setting gets an overlay; `userns` is the user namespace its chain
    starts in (None: none, as root or where none is allowed), `sandboxes` the private dir its own dir is in. `quiet`
    (the fork server's warm-up, before a run's logs exist): the fallback to copies is not said."""
    possible = os.geteuid() == 0 or userns is not None
    wanted = workspace == "overlay" or (workspace == "auto" and possible)
    if wanted and not _overlay_works:  # probed until it first works, then known for the process
        if await _probe_overlay_once(userns, sandboxes):
            _overlay_works.append(True)
        elif workspace == "overlay":
            raise SandboxError("overlayfs workspace requested but it cannot be mounted here: it needs root, or "
                               "Linux 5.11 or later with unprivileged user namespaces allowed")
        else:
            wanted = False
    if not wanted and workspace == "auto" and not _copy_said and not quiet:
        _copy_said.append(True)
        log.warning("sandbox_workspace_copied", detail="overlayfs cannot be mounted here (not as root, nor in a "
                    "user namespace): every local sandbox copies its repo and image root, seconds and the "
                    "image's size on disk per start")
    return wanted


async def _probe_overlay_once(userns: UserNamespace | None, sandboxes: Path) -> bool:
    """The probe's answer, one probe at a time per event loop: a wave's sandboxes all start at once, and each
    probe is a process chain (128 of them at a worker's first wave, before this)."""
    loop = asyncio.get_running_loop()
    probing = _overlay_probes.get(loop)
    if probing is None or (probing.done() and not probing.result()):
        probing = _overlay_probes[loop] = loop.create_task(_probe_overlay(userns, sandboxes))
    return await asyncio.shield(probing)


async def _probe_overlay(userns: UserNamespace | None, sandboxes: Path) -> bool:
    """Mount an overlay of scratch dirs of the probe's own (not a sandbox's: the probe is shared, and outlives
    a start that is cancelled meanwhile) in the namespaces a sandbox's chain enters."""
    scratch = await to_thread_kept(make_private_subdir, sandboxes, f"overlay-probe-{uuid.uuid4().hex[:8]}",
                                   ("lower", "upper", "work", "merged"), {OWNER_FILE: str(os.getpid())})
    try:
        namespaces = (userns.argv(mount=True) if userns is not None
                      else ["unshare", "--mount", "--propagation", "private", "--"])
        proc = await asyncio.create_subprocess_exec(
            *namespaces, "sh", "-c", SETUP_SCRIPT, "sh", "", "--",
            *(str(scratch / sub) for sub in ("lower", "upper", "work", "merged")), "--", "true",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        return await proc.wait() == 0
    finally:
        await asyncio.to_thread(remove_sandbox_dir, scratch)
