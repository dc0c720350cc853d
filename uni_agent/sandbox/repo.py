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
from pathlib import Path

PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)
BUNDLED_TASKS_DIR = Path(PACKAGE_DIR) / "tasks" / "bundled"

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "uni-agent",
    "GIT_AUTHOR_EMAIL": "uni-agent@localhost",
    "GIT_COMMITTER_NAME": "uni-agent",
    "GIT_COMMITTER_EMAIL": "uni-agent@localhost",
}


def cache_root() -> Path:
    root = Path(os.environ.get("UNI_AGENT_CACHE_DIR") or Path.home() / ".cache" / "uni-agent")
    root.mkdir(parents=True, exist_ok=True)
    return root


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
    digest = hashlib.sha256(str(path).encode())
    for file in sorted(p for p in path.rglob("*") if ".git" not in p.relative_to(path).parts):
        stat = file.lstat()
        digest.update(f"{file.relative_to(path)}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def prepare_base_repo(source: Path) -> Path:
    """A cached git snapshot of `source` (all files committed), shared read-only by every sandbox of the task.

    Built in a temp dir and renamed into place, so concurrent workers never see a half-built snapshot.
    """
    base = cache_root() / "repos" / f"{source.name}-{_tree_fingerprint(source)}"
    if base.is_dir():
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=f".{base.name}-", dir=base.parent))
    try:
        shutil.copytree(source, building, symlinks=True, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
        env = {**os.environ, **GIT_IDENTITY, "GIT_CONFIG_GLOBAL": "/dev/null"}
        run = lambda *args: subprocess.run(["git", *args], cwd=building, env=env, check=True, capture_output=True)  # noqa: E731
        if not (building / ".git").exists():
            run("init", "-q", "-b", "main")
        run("add", "-A")
        run("commit", "-q", "--allow-empty", "--no-verify", "-m", "uni-agent base snapshot")
        try:
            os.rename(building, base)
        except OSError:  # another worker finished first; theirs is identical
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return base


def archive_tree(root: Path) -> bytes:
    """A tar of `root` (the task's git snapshot, .git included), to unpack at the workdir through exec stdin."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(root, arcname=".")
    return buffer.getvalue()
