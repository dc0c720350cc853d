"""Ordinary users for tests that must run as someone other than root, beside someone else.

Root creates them (`useradd`: a home, a group of their own and, as Debian gives every new user, a range of
subordinate ids in /etc/subuid and /etc/subgid, unless asked not to); where the tests do not run as root they skip
and say why. A command runs as a user through `runuser` with a clean environment (HOME, USER, PATH and what the
test adds), from the user's home; Python runs from this interpreter (the project's venv). The venv and the repo
must be readable by everyone, as a site install is; where a directory above them lets no one else through (a CI
checkout under a 0700 directory), others are given traverse permission (o+x, not listing) on it for the session and
the mode is put back at exit. Users this module created are removed again by `remove_users`, or when the process
that made them exits (their processes, found by uid, killed first); those that existed before are left alone, but for
one this module made in a test run
that has ended without removing it (killed halfway): its home's CREATOR_FILE names a process that is gone, and it is
removed and made afresh rather than handing the next run the last one's files.

    users = ensure_users(["ua-test-a", "ua-test-b"])        # pytest.skip where that cannot be done
    done = run_python_as(users[0], "import os; print(os.getuid())")
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

PATH = "/usr/local/bin:/usr/bin:/bin"
_created: list[str] = []  # by this process, so removed by it
CREATOR_FILE = ".uni-agent-test-user"  # in a user's home: the pid of the test process that made the user
_opened: dict[Path, int] = {}  # directories given o+x for this session: their modes before
REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path


def unavailable_reason() -> str | None:
    """Why users cannot be created and used here, or None."""
    if os.geteuid() != 0:
        return "creating test users needs root (useradd); this run is not root"
    missing = [tool for tool in ("useradd", "userdel", "runuser") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed"
    return None


def ensure_user(name: str, *, subordinate_ids: bool = True) -> User:
    """The user `name`, created unless it exists (skips the test where it cannot be)."""
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    existing = None
    with contextlib.suppress(KeyError):
        existing = _user(pwd.getpwnam(name))
    if existing is not None and name not in _created and _left_by_an_ended_run(existing):
        _remove(existing)
        existing = None
    if existing is None:
        existing = _create(name, subordinate_ids)
    _open_the_way()
    probe = run_python_as(existing, "import uni_agent")
    if probe.returncode != 0:
        pytest.skip(f"{sys.executable} (-> {os.path.realpath(sys.executable)}) cannot import uni_agent as {name} "
                    "(are the venv and its Python readable by everyone? examples/setup.sh uses /usr/bin/python3): "
                    f"{probe.stderr.strip()[-500:]}")
    return existing


def _create(name: str, subordinate_ids: bool) -> User:
    lock = Path(tempfile.gettempdir()) / "uni-agent-test-users.lock"
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # useradd edits /etc/passwd and /etc/subuid: one at a time
        with contextlib.suppress(KeyError):
            return _user(pwd.getpwnam(name))  # made meanwhile by another session
        argv = ["useradd", "--create-home", "--user-group", "--shell", "/bin/bash"]
        if not subordinate_ids:
            argv += ["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0"]
        done = subprocess.run([*argv, name], capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            pytest.skip(f"useradd {name} failed: {done.stderr.strip()}")
        if not _created:  # the users this process made go when it exits, whichever test module made them
            atexit.register(_remove_created, os.getpid())
        _created.append(name)
        user = _user(pwd.getpwnam(name))
        (user.home / CREATOR_FILE).write_text(f"{os.getpid()}\n")
    return user


def _left_by_an_ended_run(user: User) -> bool:
    """Whether this module made `user` in a process that has ended (its CREATOR_FILE names a pid no longer running).
    A user without the file, made by someone else, is never taken for one."""
    try:
        creator = int((user.home / CREATOR_FILE).read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(creator, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _open_the_way() -> None:
    """Give others traverse permission on the directories above the repo and the venv that lack it (a 0700 parent
    of a CI checkout), so a user can reach the interpreter and the code; put the modes back at exit."""
    for leaf in (REPO_ROOT, Path(sys.prefix), Path(sys.executable).parent):
        for directory in reversed([leaf, *leaf.parents]):
            if directory in _opened:
                continue
            mode = stat.S_IMODE(directory.stat().st_mode)
            if not mode & stat.S_IXOTH:
                if not _opened:
                    atexit.register(_close_the_way, os.getpid())
                _opened[directory] = mode
                directory.chmod(mode | stat.S_IXOTH)


def _close_the_way(creator: int) -> None:
    if os.getpid() != creator:  # a forked child exits while the session still runs
        return
    for directory, mode in _opened.items():
        with contextlib.suppress(OSError):
            directory.chmod(mode)


def ensure_users(names: Iterable[str], *, subordinate_ids: bool = True) -> list[User]:
    return [ensure_user(name, subordinate_ids=subordinate_ids) for name in names]


def _user(entry: pwd.struct_passwd) -> User:
    return User(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


def argv_as(user: User, argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """argv run as `user`, with a clean environment: HOME, USER, LOGNAME, PATH, LANG, then `env`."""
    clean = {"HOME": str(user.home), "USER": user.name, "LOGNAME": user.name, "PATH": PATH, "LANG": "C.UTF-8",
             **(env or {})}
    return ["runuser", "-u", user.name, "--", "env", "-i", *(f"{k}={v}" for k, v in clean.items()), *argv]


def run_as(user: User, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 300,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run argv as `user` in its home and wait for it (output captured as text)."""
    return subprocess.run(argv_as(user, argv, env), capture_output=True, text=True, timeout=timeout, input=input,
                          cwd=user.home)


def popen_as(user: User, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """As run_as, without waiting (stdin, stdout and stderr are pipes): for two users at once."""
    return subprocess.Popen(argv_as(user, argv, env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=user.home)


def run_python_as(user: User, code: str, *, env: Mapping[str, str] | None = None,
                  timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet as `user` with the interpreter running the tests."""
    return run_as(user, [sys.executable, "-c", code], env=env, timeout=timeout)


def kill_processes_of(user: User, timeout: float = 10) -> None:
    """SIGKILL every process running with the user's uid (by pid), until none is left."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _uid_of(p) == user.uid]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _uid_of(proc: Path) -> int | None:
    try:
        return proc.stat().st_uid
    except OSError:
        return None


def remove_users(names: Iterable[str] | None = None) -> None:
    """Remove the users this process created (or those of `names` among them): their processes, home, default
    sandbox root and subordinate ids."""
    for name in list(names if names is not None else _created):
        if name not in _created:
            continue
        with contextlib.suppress(KeyError):
            _remove(_user(pwd.getpwnam(name)))
        _created.remove(name)


def _remove_created(creator: int) -> None:
    if os.getpid() == creator:  # not a forked child exiting while the session still runs
        remove_users()


def _remove(user: User) -> None:
    """The user, its processes, home, default sandbox root and subordinate ids."""
    kill_processes_of(user)
    shutil.rmtree(Path(tempfile.gettempdir()) / f"uni-agent-{user.uid}", ignore_errors=True)  # its sandbox root
    subprocess.run(["userdel", "--remove", user.name], capture_output=True, timeout=60)


def shared_dir(prefix: str) -> Path:
    """A fresh directory under the temp dir that every user can read (for images and inputs the test prepares)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path
