"""The user's uni-agent cache on disk: how big each part is (`uni-agent cache size`) and removing repository
snapshots nobody used lately (`uni-agent cache prune`).

Disk is counted per distinct file (inode), so the git objects that snapshots share through hard links
(sandbox/repo.py) count once, under `repos/.objects`, and a snapshot counts only what it alone holds.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .private_dirs import cache_dir
from .sandbox.repo import LAST_USED, OBJECT_STORE, REPOS_DIR

DAY_S = 86400.0


@dataclass
class PartSize:
    name: str
    entries: int
    bytes: int


def cache_size(root: Path | None = None) -> list[PartSize]:
    """Each top-level part of the cache (repos, envs, images, ...), repos split into snapshots and shared
    objects; bytes on disk, each inode counted once, in the first part that reaches it."""
    root = cache_dir() if root is None else root
    if not root.is_dir():
        return []
    seen: set[tuple[int, int]] = set()
    parts = []
    repos = root / REPOS_DIR
    if repos.is_dir():
        snapshots = [p for p in repos.iterdir() if p.is_dir() and not p.name.startswith(".")]
        parts.append(PartSize(f"{REPOS_DIR}/{OBJECT_STORE} (shared git objects)", _count(repos / OBJECT_STORE),
                              _disk(repos / OBJECT_STORE, seen)))
        parts.append(PartSize(f"{REPOS_DIR} (snapshots)", len(snapshots), sum(_disk(p, seen) for p in snapshots)))
    for part in sorted(p for p in root.iterdir() if p.name != REPOS_DIR):
        entries = len(list(part.iterdir())) if part.is_dir() else 1
        parts.append(PartSize(part.name, entries, _disk(part, seen)))
    return parts


def prune_repos(older_than_days: float = 7.0, root: Path | None = None) -> tuple[int, int]:
    """Remove snapshots not used for `older_than_days` (0: all), half-built ones a day old, then the shared objects
    no snapshot links any more. Returns (snapshots removed, bytes freed). A snapshot in use by a live sandbox was
    touched at its start: prune with a horizon longer than your runs."""
    repos = (cache_dir() if root is None else root) / REPOS_DIR
    if not repos.is_dir():
        return 0, 0
    before = sum(p.bytes for p in cache_size(repos.parent) if p.name.startswith(REPOS_DIR))
    now, removed = time.time(), 0
    for snapshot in [p for p in repos.iterdir() if p.is_dir() and p.name != OBJECT_STORE]:
        building = snapshot.name.startswith(".")
        stamp = snapshot / LAST_USED
        used = (stamp if stamp.exists() else snapshot).stat().st_mtime
        if now - used >= (DAY_S if building else older_than_days * DAY_S):
            shutil.rmtree(snapshot, ignore_errors=True)
            removed += not building
    store = repos / OBJECT_STORE
    if store.is_dir():
        for file in [f for f in store.rglob("*") if f.is_file()]:
            if file.stat().st_nlink == 1:  # only the store holds it: no snapshot uses this object
                file.unlink()
        for directory in sorted((d for d in store.rglob("*") if d.is_dir()), key=lambda d: -len(d.parts)):
            if not any(directory.iterdir()):
                directory.rmdir()
    after = sum(p.bytes for p in cache_size(repos.parent) if p.name.startswith(REPOS_DIR))
    return removed, before - after


def _disk(path: Path, seen: set[tuple[int, int]]) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                stat = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            key = (stat.st_dev, stat.st_ino)
            if key not in seen:
                seen.add(key)
                total += stat.st_blocks * 512
    return total


def _count(path: Path) -> int:
    return sum(len(files) for _, _, files in os.walk(path))


def format_sizes(parts: list[PartSize], root: Path) -> str:
    lines = [f"uni-agent cache at {root}"]
    lines += [f"  {p.name:<40} {p.entries:>7} entries {p.bytes / 2**20:>10.1f} MiB" for p in parts]
    lines.append(f"  {'total':<40} {'':>15} {sum(p.bytes for p in parts) / 2**20:>10.1f} MiB")
    return "\n".join(lines)


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="cache_command", required=True)
    sub.add_parser("size", help="disk used by each part of the cache (shared files counted once)")
    prune = sub.add_parser("prune", help="remove repository snapshots not used lately, and git objects no "
                                         "snapshot uses any more (SWE-bench environments: `uni-agent envs prune`)")
    prune.add_argument("--older-than", type=float, default=7.0, metavar="DAYS",
                       help="remove snapshots unused for DAYS (default 7; 0: every snapshot)")


def cmd_cache(args) -> int:
    root = cache_dir()
    if args.cache_command == "prune":
        removed, freed = prune_repos(args.older_than)
        print(f"removed {removed} repository snapshots, freed {freed / 2**20:.1f} MiB")
    print(format_sizes(cache_size(root), root))
    return 0
