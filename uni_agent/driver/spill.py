"""Where finished results wait when the output dir cannot take them (a full disk, a quota, a read-only remount).

A run whose results cannot be written keeps them in memory and retries (uni_agent.driver.results); when it has to
end before a write succeeds, what is still unwritten goes to a spill: Parquet part files, like those of
<output_dir>/results, in a directory of the user's cache that is named after the output dir
(`<cache>/unwritten-results/<dir name>-<hash of its path>/`, with a note saying which output dir it belongs to), so on
another disk than the full one. The next run with the same output dir reads the spilled rows as done (they are not
run again) and moves them into results/ as soon as it can write there. Where the cache cannot take them either, the
system's temporary directory is tried.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ..private_dirs import UnsafeDirectory, cache_dir, private_tmp

NOTE = "OUTPUT_DIR.txt"


def spill_roots() -> list[Path]:
    """Where spills go, in order of preference: the user's cache, then the user's private dir in the temporary
    directory (the one that holds the local sandboxes: uni_agent.sandbox.private_dir)."""
    return [cache_dir() / "unwritten-results", _private_tmp() / "unwritten-results"]


def _private_tmp() -> Path:  # not checked here: a spill into it checks it first (private_tmp())
    return Path(tempfile.gettempdir()) / f"uni-agent-{os.geteuid()}"


def spill_dirs(output_dir: Path) -> list[Path]:
    """The spill dirs of `output_dir`, one per root (most do not exist)."""
    path = output_dir.resolve()
    key = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return [root / f"{path.name}-{key}" for root in spill_roots()]


def spilled_files(output_dir: Path) -> list[Path]:
    return sorted(f for d in spill_dirs(output_dir) if d.is_dir() for f in d.glob("part-*.parquet"))


def spill(output_dir: Path, table: pa.Table) -> Path:
    """Write `table` as a part file in the first spill dir that takes it; returns the file. OSError when none does
    (the last root's error)."""
    error: Exception | None = None
    for directory in spill_dirs(output_dir):
        try:
            if directory.is_relative_to(_private_tmp()):  # a shared /tmp: only a dir of ours, 0700
                private_tmp()
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            (directory / NOTE).write_text(f"{output_dir.resolve()}\n")
            return write_part(directory, table)
        except (OSError, UnsafeDirectory) as exc:
            error = exc
    raise OSError(f"no spill dir takes the results: {error}") from error


def write_part(directory: Path, table: pa.Table) -> Path:
    """`table` as a new part file of `directory`, atomically: a hidden temp name, then a rename. A failed write
    leaves no file behind."""
    name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.parquet"
    tmp = directory / f".{name}.tmp"  # hidden from readers until renamed
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, directory / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return directory / name


def adopt(output_dir: Path, results_dir: Path, schema: pa.Schema) -> int:
    """Move the spilled part files of `output_dir` into `results_dir` (each written there, then removed from the
    spill); returns how many rows moved. Stops at the first file that cannot be written (the disk still full): the
    rest stay spilled, and still count as done."""
    moved = 0
    for path in spilled_files(output_dir):
        table = pq.read_table(path, schema=schema)
        try:
            write_part(results_dir, table)
        except OSError:
            break
        path.unlink()
        moved += table.num_rows
    for directory in spill_dirs(output_dir):
        if directory.is_dir() and not any(directory.glob("part-*.parquet")):
            (directory / NOTE).unlink(missing_ok=True)
            try:
                directory.rmdir()
            except OSError:
                pass
    return moved
