"""Sandbox dirs whose owner is gone: found and removed at sandbox starts (a worker killed with -9 cannot clean up
after itself), a sandbox dir's own removal, in an order that a kill halfway cannot turn into a leak, on the
process's one removal thread, and the making of what a teardown must remove, kept through a cancel
(to_thread_kept)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import threading
import time
from pathlib import Path

from .process_limit import reap_orphaned_cgroups
from .userns import remove_tree

OWNER_FILE = "owner.pid"

# A sandbox start reaps the root at most this often per process. Every start used to: at 1,024 sandboxes under one
# root a reap lists them all (~1 ms of CPU on this project's 2-core VM), once per start, so a wave of 1,024 paid
# ~0.5 s of its workers' CPU for dirs that a dead worker left, which the next start a few seconds later finds as well.
REAP_EVERY_S = 5.0
_last_reap: dict[str, float] = {}

# Removals go through one thread per process: concurrent ones (the default pool's threads, a wave's sandboxes
# closing together) fight over the sandboxes root's lock and the interpreter's, and cost more CPU for no gain in
# time (256 closed at once on the 2-core VM: 1.45-2.05 ms of the process's CPU per sandbox with the pool,
# 0.76-0.96 with one thread, 0.44-0.57 s either way; `uni-agent bench --sandbox-only`'s wave figure). Made per
# process: a forked child inherits an executor whose thread it does not have, and work given to it would wait forever.
_removals: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


async def to_thread_kept(func, *args):
    """asyncio.to_thread for a call that makes something the teardown must remove (the sandbox's dir, an image
    lease): a cancel that arrives while the thread runs waits for it, its result is returned, and the cancel is
    raised again at the caller's next await. (With to_thread the result was lost and the dir made after the
    teardown had looked for it: a rollout whose first model call failed left its sandbox dir behind.)"""
    # A plain future, not a task: a loop's shutdown cancels every task, and this one must not be.
    work = asyncio.get_running_loop().run_in_executor(None, func, *args)
    cancelled = False
    try:
        while True:
            try:
                return await asyncio.shield(work)
            except asyncio.CancelledError:
                if work.cancelled():
                    raise
                cancelled = True
    finally:
        if cancelled and (task := asyncio.current_task()) is not None:
            task.cancel()


def reap_due(root: Path) -> bool:
    """Whether a sandbox start should reap `root` now (REAP_EVERY_S since this process last did); says yes once."""
    now = time.monotonic()
    last = _last_reap.get(str(root))
    if last is not None and now - last < REAP_EVERY_S:
        return False
    _last_reap[str(root)] = now
    return True


def reap_orphaned_sandboxes(root: Path) -> list[Path]:
    """Remove sandbox dirs whose owning process is gone (a worker killed with -9 cannot clean up after itself).

    Its sandbox died with it (PDEATHSIG, bwrap --die-with-parent, and the overlay mount lived only in the
    sandbox's namespace), so only the directory is left. Run at sandbox starts, at most every REAP_EVERY_S
    (reap_due): another worker on this host may have died since the last one. Kept cheap with a thousand sandboxes
    under the root (a read per dir per reap would be O(n^2) in all): each dir's owner is read once per process and
    remembered, liveness is checked once per distinct owner, and a reap that finds another one running in this
    process returns at once (that one is as recent)."""
    if not _reap_lock.acquire(blocking=False):
        return []
    try:
        removed = []
        prefix = os.path.join(root, "")  # plain strings: a Path per dir per start is what costs with 1000 dirs
        names = os.listdir(root)
        listed = {prefix + name for name in names}
        for gone in [key for key in _owners if key.startswith(prefix) and key not in listed]:
            del _owners[gone]
        alive: dict[int, bool] = {}
        for name in names:
            key = prefix + name
            owner = _owners.get(key)
            if owner is None:
                try:
                    with open(os.path.join(key, OWNER_FILE)) as f:
                        owner = _owners[key] = int(f.read())
                except (OSError, ValueError):
                    continue  # not ours, or still being created
            if owner not in alive:
                alive[owner] = os.path.exists(f"/proc/{owner}")
            if not alive[owner]:
                remove_sandbox_dir(key)
                removed.append(root / name)
                _owners.pop(key, None)
        reap_orphaned_cgroups()  # machine-wide: also those of sandboxes under another root
        return removed
    finally:
        _reap_lock.release()


async def remove_in_removal_thread(path: str | os.PathLike[str]) -> None:
    """remove_sandbox_dir on the process's removal thread (why one thread: _removals)."""
    global _removals
    if _removals is None or _removals[0] != os.getpid():
        _removals = (os.getpid(), concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="uni-agent-removal"))
    await asyncio.get_running_loop().run_in_executor(_removals[1], remove_sandbox_dir, path)


def remove_sandbox_dir(path: str | os.PathLike[str]) -> None:
    """Remove a sandbox dir, its owner file last: a removal cut short (its worker killed) leaves a dir that still
    names its dead owner, which the next reap finishes, never one that no reap would touch."""
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(path):
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            elif entry.name != OWNER_FILE:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
    remove_tree(path)


_reap_lock = threading.Lock()
_owners: dict[str, int] = {}  # sandbox dir → owner pid, as read from its owner file (it never changes)
