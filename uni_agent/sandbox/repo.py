"""Task repositories for sandboxes: where a task's repository is, and its cached git snapshot (the base of a patch).

Every backend starts from the same snapshot: local mounts it as the overlay's lower layer (or copies it), the
container backend copies it in, Modal uploads it as a tar.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from .private_dir import private_cache_dir

PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
BUNDLED_TASKS_DIR = Path(PACKAGE_DIR) / "tasks" / "bundled"

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "uni-agent",
    "GIT_AUTHOR_EMAIL": "uni-agent@localhost",
    "GIT_COMMITTER_NAME": "uni-agent",
    "GIT_COMMITTER_EMAIL": "uni-agent@localhost",
}


REPOS_DIR = "repos"  # under the cache: one snapshot per distinct source tree
OBJECT_STORE = ".objects"  # under REPOS_DIR: git object files, hard-linked into every snapshot that has them
LAST_USED = ".git/uni-agent-last-used"  # in each snapshot, touched at each use: what `uni-agent cache prune` goes by


def cache_root() -> Path:
    return private_cache_dir()


def resolve_repo(repo: str) -> Path:
    """`bundled:<instance_id>` or a directory path → the directory holding the repository."""
    from .base import SandboxStartError

    if repo.startswith("bundled:"):
        path = BUNDLED_TASKS_DIR / repo.removeprefix("bundled:") / "repo"
    else:
        path = Path(repo).expanduser()
    if not path.is_dir():
        raise SandboxStartError(f"task repository {repo!r} not found (looked at {path})")
    return path.resolve()


def _tree_fingerprint(path: Path) -> str:
    """Names, sizes and mtimes of everything in the tree but git's own dirs, hashed: computed at every sandbox start,
    so it never enters a `.git` (rglob walked every git object and dropped them after: 79 ms a start for a 3,300-file
    tree) and stats each entry once."""
    digest = hashlib.sha256(str(path).encode())
    root = str(path)
    entries: list[tuple[str, os.stat_result]] = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in dirs + [f for f in files if f != ".git"]:  # a worktree's or submodule's .git file too
            full = os.path.join(directory, name)
            entries.append((os.path.relpath(full, root), os.lstat(full)))
    for relative, stat in sorted(entries):
        digest.update(f"{relative}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


_walks: dict[str, tuple[threading.Lock, list[tuple[float, str]]]] = {}  # source -> its lock, its last walk
_walks_lock = threading.Lock()


def _fresh_fingerprint(source: Path) -> str:
    """The tree's fingerprint from a walk that began after this call did (so no edit made before a sandbox start is
    missed), shared: a wave of starts of one task waits for one walk at a time and takes its result, instead of
    each walking the tree (128 starts on a worker, 128 walks)."""
    asked = time.monotonic()
    with _walks_lock:
        lock, last = _walks.setdefault(str(source), (threading.Lock(), []))
    with lock:
        if last and last[0][0] >= asked:
            return last[0][1]
        began = time.monotonic()
        fingerprint = _tree_fingerprint(source)
        last[:] = [(began, fingerprint)]
        return fingerprint


def prepare_base_repo(source: Path) -> Path:
    """A cached git snapshot of `source`, shared read-only by every sandbox of the task.

    A clean git checkout keeps its HEAD (SWE-bench's base_commit stays HEAD inside the sandbox); any other tree gets
    one "uni-agent base snapshot" commit of all its files. The snapshot's git objects are hard links into one
    object store, so snapshots of the same history share their disk. Built in a temp dir and renamed into place, so
    concurrent workers never see a half-built snapshot.
    """
    base = cache_root() / REPOS_DIR / f"{source.name}-{_fresh_fingerprint(source)}"
    if base.is_dir():
        _touch(base / LAST_USED)
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{base.name}-", dir=base.parent))
    try:
        shutil.copytree(source, building, symlinks=True, dirs_exist_ok=True, ignore=_ignore_for(source))
        env = {**os.environ, **GIT_IDENTITY, "GIT_CONFIG_GLOBAL": "/dev/null"}
        run = lambda *args: subprocess.run(["git", *args], cwd=building, env=env, check=True, capture_output=True)  # noqa: E731
        if (source / ".git").is_dir():
            link_objects(source / ".git" / "objects", building / ".git" / "objects", base.parent / OBJECT_STORE)
        else:  # no repository, or a worktree's .git file naming a git dir the sandbox could not see
            (building / ".git").unlink(missing_ok=True)
            run("init", "-q", "-b", "main")
        if run("status", "--porcelain").stdout.strip() or not _has_head(run):
            run("add", "-A")
            run("commit", "-q", "--allow-empty", "--no-verify", "-m", "uni-agent base snapshot")
        _touch(building / LAST_USED)
        try:
            os.rename(building, base)
        except OSError:  # another worker finished first; theirs is identical
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return base


def _ignore_for(source: Path):
    """copytree's ignore: caches anywhere, and the git object store (linked instead, link_objects)."""
    git_dir = str(source / ".git")

    def ignore(directory: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in ("__pycache__", ".pytest_cache")}
        return skipped | ({"objects"} & set(names) if directory == git_dir else set())
    return ignore


def link_objects(source_objects: Path, objects: Path, store: Path) -> None:
    """Fill `objects` (a snapshot's .git/objects) with hard links to `store`'s copies of every object file of
    `source_objects` and of the object stores it borrows from (info/alternates, which the sandbox could not see).
    Object and pack files are named by their content, so one path in the store is one content."""
    for directory in _object_dirs(source_objects):
        for file in directory.rglob("*"):
            relative = file.relative_to(directory)
            if relative.parts[0] == "info" or not file.is_file():
                continue
            shared = store / relative
            if not shared.exists():
                shared.parent.mkdir(parents=True, exist_ok=True)
                partial = shared.with_name(f".{shared.name}.{os.getpid()}.{threading.get_ident()}.tmp")
                shutil.copy2(file, partial)  # a copy: the store's own inode, so prune can tell what is still used
                os.replace(partial, shared)
            target = objects / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(shared, target)
    (objects / "info").mkdir(parents=True, exist_ok=True)


def _object_dirs(objects: Path, seen: set[Path] | None = None) -> list[Path]:
    seen = set() if seen is None else seen
    objects = objects.resolve()
    if objects in seen or not objects.is_dir():
        return []
    seen.add(objects)
    found = [objects]
    alternates = objects / "info" / "alternates"
    if alternates.is_file():
        for line in alternates.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                found += _object_dirs((objects / line.strip()) if not os.path.isabs(line.strip())
                                      else Path(line.strip()), seen)
    return found


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:  # another file system, or a file of another user (protected_hardlinks)
        shutil.copy2(source, target)


def _has_head(run) -> bool:
    try:
        run("rev-parse", "--verify", "-q", "HEAD")
    except subprocess.CalledProcessError:
        return False
    return True


def _touch(path: Path) -> None:
    try:
        path.touch()
    except OSError:  # a snapshot shared read-only: its age is then its build time
        pass


def archive_tree(root: Path) -> bytes:
    """A tar of `root` (the task's git snapshot, .git included), to unpack at the workdir through exec stdin."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(root, arcname=".")
    return buffer.getvalue()
