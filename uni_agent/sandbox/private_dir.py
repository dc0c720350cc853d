"""The local sandboxes' root: a directory that belongs to the user who runs them and to nobody else.

A sandbox dir holds the sandbox's files and, for a sandbox that is a bwrap of its own, its `state/state.sh`, the
exported environment (secrets included; a fork server's sandbox keeps it on its own tmpfs), so the root must not be
readable, and above all not writable, by anyone else: whoever can write a directory can rename or replace what is in
it, and a symlink put in place of the root would redirect every start. Hence: created mode 0700; a symlink, a
non-directory, or a directory owned by someone else is refused; one that is ours but writable by group or others is
refused too (entries may have been planted in it); one that is ours and only readable by others is tightened to
0700. The checks run on a file descriptor opened with O_NOFOLLOW, so what is checked is what is used.

The default is `<tempdir>/uni-agent-<uid>/sandboxes`: on disk (a sandbox's writes, pip installs and builds included,
land there), moved by TMPDIR (a SLURM job's local scratch). Not `$XDG_RUNTIME_DIR`: a small tmpfs in memory (logind
gives it 10% of RAM), removed at the user's last logout and often unset in batch jobs. In a shared /tmp another user
can squat the name before we create it; that is refused with a message naming the path and the way out
(UNI_AGENT_SANDBOX_ROOT), never used.

The checks here serve every private directory of a run (uni_agent.private_dirs, which lists them and imports them
from here); the user's cache (`cache_dir`) is here too, as the sandboxes keep their repository snapshots in it.
"""

from __future__ import annotations

import os
import pwd
import stat
import tempfile
from pathlib import Path

import structlog

from .base import SandboxError

log = structlog.get_logger("uni_agent.sandbox")

ROOT_VARIABLE = "UNI_AGENT_SANDBOX_ROOT"
CACHE_VARIABLE = "UNI_AGENT_CACHE_DIR"


class UnsafeDirectory(SandboxError):
    """The sandbox root (or a sandbox dir) is not private to this user. Not retried: it will not change by itself."""


def default_sandbox_root() -> Path:
    return Path(tempfile.gettempdir()) / f"uni-agent-{os.geteuid()}" / "sandboxes"


def sandbox_root() -> Path:
    """The private directory that holds this user's local sandboxes (UNI_AGENT_SANDBOX_ROOT, else the default)."""
    explicit = os.environ.get(ROOT_VARIABLE)
    if explicit:
        return ensure_private_dir(Path(explicit).absolute(), parents=True, setting=ROOT_VARIABLE)
    root = default_sandbox_root()
    ensure_private_dir(root.parent, parents=False, setting=ROOT_VARIABLE)  # <tempdir> itself exists
    return ensure_private_dir(root, parents=False, setting=ROOT_VARIABLE)


def cache_dir() -> Path:
    """The user's cache (UNI_AGENT_CACHE_DIR, else ~/.cache/uni-agent), not checked: see `private_cache_dir`."""
    return Path(os.environ.get(CACHE_VARIABLE) or Path.home() / ".cache" / "uni-agent")


def private_cache_dir() -> Path:
    """cache_dir(), made 0700 when missing; refused when it is not ours or others may write it. It holds the task
    repositories' snapshots (repo.py), llama.cpp builds and more (uni_agent.private_dirs lists every directory a run
    keeps)."""
    return ensure_private_dir(cache_dir().absolute(), parents=True, setting=CACHE_VARIABLE)


def ensure_private_dir(path: Path, *, parents: bool, setting: str = "") -> Path:
    """`path` as a directory of ours, mode 0700: created so when missing, refused (UnsafeDirectory) when it is not."""
    if parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # does not follow a symlink in the last component: EEXIST
    except FileExistsError:
        pass
    way_out = f" (set {setting} to use another)" if setting else ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        what = "is a symbolic link" if os.path.islink(path) else f"cannot be opened as a directory ({exc.strerror})"
        raise UnsafeDirectory(f"private directory {path} {what}; refusing to use it{way_out}") from None
    try:
        check_private(fd, path, way_out)
    finally:
        os.close(fd)
    return path


def check_private(fd: int, path: Path, way_out: str = "") -> None:
    info = os.fstat(fd)
    me = os.geteuid()
    if info.st_uid != me:
        raise UnsafeDirectory(f"private directory {path} is owned by {owner_name(info.st_uid)}, not by you "
                              f"({owner_name(me)}); refusing to use it: ask them to remove it{way_out}")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        raise UnsafeDirectory(f"private directory {path} is writable by group or others (mode {mode:04o}): someone "
                              f"else may have put entries in it; remove it{way_out}")
    if mode & 0o077:
        os.fchmod(fd, mode & 0o700)
        log.warning("sandbox_dir_tightened", path=str(path), mode_was=f"{mode:04o}", mode="0700")


def owner_name(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def make_private_subdir(root: Path, name: str, subdirs: tuple[str, ...], files: dict[str, str]) -> Path:
    """`root/name`, mode 0700, with these subdirectories and small files, made through file descriptors of the
    root as opened and checked right here (O_NOFOLLOW): a root swapped for a symlink after sandbox_root() looked at
    it cannot redirect the new directory elsewhere."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        root_fd = os.open(root, flags)
    except OSError as exc:
        raise UnsafeDirectory(f"private directory {root} cannot be opened as a directory of its own "
                              f"({exc.strerror}); refusing to use it") from None
    try:
        check_private(root_fd, root)
        os.mkdir(name, 0o700, dir_fd=root_fd)
        fd = os.open(name, flags, dir_fd=root_fd)
    finally:
        os.close(root_fd)
    try:
        for sub in subdirs:
            os.mkdir(sub, 0o777, dir_fd=fd)  # the umask applies, as for any directory: the 0700 parent guards them
        for file_name, text in files.items():
            file_fd = os.open(file_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            with os.fdopen(file_fd, "w") as f:
                f.write(text)
    finally:
        os.close(fd)
    return root / name
