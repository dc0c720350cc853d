"""`uni-agent bench --out DIR`: a folder that holds an earlier run is refused, or cleared when asked (`--clear-out`).

A run on an output dir that holds results resumes it: with every rollout recorded it has nothing to do, and the bench
read that as its own run (issue 40: makespan 0.1 s, efficiency about 219, a negative lead-in, the earlier run's
start figures). So the bench starts only on an empty or new folder. `--clear-out` empties it first, and says what it
removed; it removes only what a bench writes there, so a mistyped path to other files is refused, not emptied.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path

# What `uni-agent bench` writes into --out: the sweep (bundled.parquet, sandboxes/, ours-w*-c*/, peer-c*/) and the
# simulation (c<in-flight>/, c<in-flight>-faults/, before/ for --baseline).
BENCH_ENTRIES = ("bundled.parquet", "sandboxes", "ours-w*-c*", "peer-c*", "c[0-9]*", "before")


class OutDirInUse(SystemExit):
    """--out holds something; the message names the folder and what is in it."""


def _listing(path: Path, names: list[str], shown: int = 8) -> str:
    words = [name + ("/" if (path / name).is_dir() else "") for name in names[:shown]]
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(words) + more


def prepare_out_dir(path: Path | None, clear: bool) -> list[str]:
    """Checks (or empties, with `clear`) the --out folder before anything runs; returns what to tell the user."""
    if path is None or not path.exists():
        return []
    if not path.is_dir():
        raise OutDirInUse(f"uni-agent bench: --out {path} is a file, not a folder")
    names = sorted(os.listdir(path))
    if not names:
        return []
    listing = _listing(path, names)
    if not clear:
        raise OutDirInUse(
            f"uni-agent bench: --out {path} is not empty (it holds {listing}). A run there would resume the earlier "
            "one and report its figures as this run's. Name a new or empty folder, or add --clear-out to remove "
            "what an earlier bench wrote there.")
    foreign = [n for n in names if not any(fnmatch.fnmatch(n, pattern) for pattern in BENCH_ENTRIES)]
    if foreign:
        raise OutDirInUse(
            f"uni-agent bench: --clear-out removes only what a bench writes, and --out {path} also holds "
            f"{_listing(path, foreign)}: nothing removed. Name another folder.")
    for name in names:
        entry = path / name
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    return [f"--clear-out: removed {listing} from {path} (an earlier bench's output)"]


def refuse_earlier_results(point_dir: Path) -> None:
    """A sweep point's own folder must not hold a run's results (the same reason, for callers that skip the CLI)."""
    if (point_dir / "results").exists():
        raise OutDirInUse(f"uni-agent bench: {point_dir} already holds a run's results: a run there would resume it. "
                          "Use a new or empty --out.")
