"""Every directory a run keeps for itself, in one place, and the check that they are ours before anything starts.

On a shared node a directory is not trusted because it exists: another user can create `/tmp/uni-agent-<uid>` or
Dask's scratch directory before our first run and plant files in it (a module there is imported by our worker
processes: Dask puts its local directory on their sys.path). So each of these is made mode 0700 by us, or refused
when it is a symlink, owned by someone else, or writable by others (uni_agent.sandbox.private_dir does the checking,
and holds the sandboxes' root and the cache, which the sandboxes use):

    private_tmp()     <tempdir>/uni-agent-<uid>          this user's scratch on the node (TMPDIR moves it)
      sandboxes/      the local sandboxes (UNI_AGENT_SANDBOX_ROOT moves it)
      dask/           Dask's local directory for the run's LocalCluster and our `dask worker` recipes
    cache_dir()       ~/.cache/uni-agent (UNI_AGENT_CACHE_DIR): llama.cpp builds, repository snapshots, images

`preflight` checks all of them (and the output dir) when a run starts, and stops it with one line naming the
directory, its owner and the fix: a refused directory must not turn every rollout into an error row.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .sandbox.private_dir import (CACHE_VARIABLE, ROOT_VARIABLE, UnsafeDirectory, cache_dir, ensure_private_dir,
                                 owner_name, private_cache_dir, sandbox_root)

GROUP_SHARED_MODE, PRIVATE_MODE = 0o750, 0o700


def private_tmp() -> Path:
    """<tempdir>/uni-agent-<uid>, checked (made 0700 when missing)."""
    path = Path(tempfile.gettempdir()) / f"uni-agent-{os.geteuid()}"
    return ensure_private_dir(path, parents=False, setting="TMPDIR")


def dask_dir() -> Path:
    """Dask's local directory for this user's workers: inside private_tmp, so nothing planted reaches sys.path."""
    return ensure_private_dir(private_tmp() / "dask", parents=False, setting="TMPDIR")


def output_dir_mode(share_with_group: bool) -> int:
    return GROUP_SHARED_MODE if share_with_group else PRIVATE_MODE


def umask_for(share_with_group: bool) -> int:
    """The file-creation mask of a run's processes: nothing for others, and for the group read only when shared."""
    return 0o027 if share_with_group else 0o077


@contextlib.contextmanager
def private_files(share_with_group: bool = False) -> Iterator[None]:
    """While a run lasts, what it creates (and what its LocalCluster's worker processes, started meanwhile, create)
    is closed to others: the process umask, put back afterwards for the code that called the run."""
    previous = os.umask(umask_for(share_with_group))
    try:
        yield
    finally:
        os.umask(previous)


def prepare_output_dir(path: Path, share_with_group: bool = False) -> Path:
    """The output dir, made with its parents, ours and closed to others (0700, or 0750 shared with the group).
    One that another user owns, or that others may write, is refused: they could swap what the run writes."""
    path.mkdir(parents=True, exist_ok=True, mode=output_dir_mode(share_with_group))
    info = os.lstat(path)
    where = f"output dir {path}"
    if stat.S_ISLNK(info.st_mode):  # a link the user made to another disk is theirs to make: follow it, check that
        info = os.stat(path)
    if info.st_uid != os.geteuid():
        raise UnsafeDirectory(f"{where} is owned by {owner_name(info.st_uid)}, not by you: choose another "
                              "--output-dir")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o002:
        raise UnsafeDirectory(f"{where} is writable by others (mode {mode:04o}): `chmod o-w {path}` or choose "
                              "another --output-dir")
    wanted = output_dir_mode(share_with_group)
    if mode & ~wanted & 0o777:
        os.chmod(path, mode & wanted)
    return path


def preflight(output_dir: Path | None = None, *, share_with_group: bool = False, sandboxes: bool = True) -> list[Path]:
    """Check (and make) every private directory a run uses, before any rollout starts; UnsafeDirectory names the
    first one that fails. Returns the directories checked. Runs on the driver and on every sandbox worker."""
    checked = [private_tmp(), dask_dir(), private_cache_dir()]
    if sandboxes:
        checked.append(sandbox_root())
    if output_dir is not None:
        checked.append(prepare_output_dir(output_dir, share_with_group))
    return checked


def _worker_problem() -> str | None:
    """On a dask worker: why its private directories cannot be used, or None."""
    try:
        preflight()
    except UnsafeDirectory as exc:
        return str(exc)
    return None


async def preflight_workers(client: Any) -> None:
    """`preflight` on every worker of the cluster (a worker on another node has its own /tmp and its own squatter);
    UnsafeDirectory names the first worker that fails and why."""
    problems = await client.run(_worker_problem)
    for worker, problem in sorted(problems.items()):
        if problem is not None:
            raise UnsafeDirectory(f"on dask worker {worker}: {problem}")


__all__ = ["CACHE_VARIABLE", "ROOT_VARIABLE", "UnsafeDirectory", "cache_dir", "dask_dir", "output_dir_mode",
           "preflight", "preflight_workers", "prepare_output_dir", "private_cache_dir", "private_files", "private_tmp", "umask_for"]


if __name__ == "__main__":  # `python -m uni_agent.private_dirs`: the checked path for `dask worker --local-directory`
    try:
        print(dask_dir())
    except UnsafeDirectory as refused:
        raise SystemExit(f"uni-agent: {refused}") from None
