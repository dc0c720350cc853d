"""Results on disk: a Parquet dataset of part files under <output_dir>/results/, appended as rollouts finish.

Each flush writes a new part file atomically (temp name, then rename), so a crash loses at most the unflushed
results and never leaves a half-written file; a rerun reads the (instance_id, rollout) keys already present and
skips them. A rollout run again (--retry-errors) is written first and its old row removed after (`supersede`), so a
crash in between leaves two rows for a key, of which `read` keeps the newer one: a key never has two rows.

The rows' columns are RESULT_SCHEMA, written out below: the project's public output (docs/outputs.md). A
RolloutResult becomes a row here (`RolloutResult.row()`: enums as their strings, structured fields as JSON text)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import structlog

from ..episode.exit_reason import ExitReason
from ..episode.failures import FailureKind
from ..episode.rollout import TOKEN_COLUMNS, RolloutResult
from .spill import adopt, spill, spilled_files, write_part

log = structlog.get_logger("uni_agent.driver.results")
RETRY_S = 5.0  # a failed write is tried again after this long (sooner when the dispatcher asks)

_TOKENS, _LOGPROBS = pa.list_(pa.int32()), pa.list_(pa.float32())  # narrow: most of a row's bytes
RESULT_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("instance_id", pa.string()), ("rollout", pa.int64()), ("data_source", pa.string()),
    ("agent_name", pa.string()),
    ("exit_reason", pa.string()),  # an ExitReason's value
    ("messages", pa.string()),  # JSON list: the whole conversation
    ("patch", pa.string()), ("reward", pa.float64()), ("resolved", pa.bool_()),
    ("masked", pa.bool_()), ("mask_reason", pa.string()),
    ("failure_kind", pa.string()),  # a FailureKind's value
    ("failure_cause", pa.string()),  # "<part>: <error>" for infra (a FailedPart's value first)
    ("num_turns", pa.int64()), ("prompt_tokens", pa.int64()), ("completion_tokens", pa.int64()),
    ("sandbox_start_s", pa.float64()), ("llm_s", pa.float64()), ("tools_s", pa.float64()), ("verify_s", pa.float64()),
    ("total_s", pa.float64()),
    ("verification", pa.string()),  # JSON object: the Verification ("{}" when not graded)
    ("error", pa.string()), ("worker", pa.string()), ("started_at", pa.float64()), ("finished_at", pa.float64()),
    ("input_ids", _TOKENS), ("loss_mask", _TOKENS), ("logprobs", _LOGPROBS),
    ("token_source", pa.string()), ("tokens_missing", pa.string()),
    ("token_drift", pa.string()),  # JSON object or null
    ("token_versions", _TOKENS), ("version_min", pa.int64()), ("version_max", pa.int64()), ("step", pa.int64()),
    ("policy_version", pa.int64()), ("staleness_action", pa.string()), ("stale_restarts", pa.int64()),
    ("attempts", pa.string()),  # JSON list of the rows this one replaced
    ("chains", pa.string()), ("harness", pa.string()),  # JSON, harness rows only
])
KEY = ["instance_id", "rollout"]


class ResultsNotWritten(RuntimeError):
    """Finished results could not be written to the output dir before the run ended: the message says how many, where
    they are kept (a spill the next run in the same output dir writes first) and how many rollouts did not start."""


class ResultStore:
    """The run's results: finished rows wait in memory until a flush writes them as a part file. A write that fails
    (OSError: a full disk, a quota) keeps them waiting and is retried; `write_error` says why while it fails.
    `finish` writes what waits at the end of a run or spills it (uni_agent.driver.spill); rows spilled by an earlier
    run count as done and move into results/ at the first write that succeeds."""

    def __init__(self, output_dir: str | Path, flush_every: int = 16, flush_s: float = 1.0):
        self.output_dir = Path(output_dir)
        self.dir = self.output_dir / "results"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.write_error: str | None = None  # the last write's error while writes fail
        self.failing_since: float | None = None
        self.failed_writes = 0
        self.not_started = 0  # rollouts the dispatcher did not start because writes kept failing
        self.spilled: tuple[int, Path] | None = None  # rows spilled by finish(), and where
        self.lost = 0  # rows that could be written neither here nor to a spill
        self._retry_at = 0.0
        if spilled_files(self.output_dir) and (moved := adopt(self.output_dir, self.dir, RESULT_SCHEMA)):
            log.warning("spilled_results_written", rows=moved, results=str(self.dir))
        # A part file holds at least flush_every rows, and a burst of results (a wave finishing together) makes at
        # most one a flush_s: 20,000 results written 16 at a time cost seconds of the driver's loop after the work.
        self.flush_every, self.flush_s = flush_every, flush_s
        self._flushed_at = -float("inf")  # the first part file is not held back
        self._buffer: list[dict[str, Any]] = []
        self.retrying: dict[tuple[str, int], list[dict[str, Any]]] = {}  # key -> its earlier attempts

    def done_keys(self, retry_infra: bool = False) -> set[tuple[str, int]]:
        """Keys already recorded. With `retry_infra`, rows whose failure_kind is infra do not count as done: they
        run again, and the new row records the old ones in `attempts`. An engine outage's rows (engine_down) run
        again without it."""
        frame = self.read(columns=[*KEY, "failure_kind", "exit_reason"])
        keys = list(zip(frame["instance_id"], frame["rollout"].astype(int), strict=True))
        infra = set(k for k, kind, reason in zip(keys, frame["failure_kind"], frame["exit_reason"], strict=True)
                    if kind == FailureKind.INFRA and (retry_infra or reason == ExitReason.ENGINE_DOWN))
        if infra:
            rows = self.read()
            for row in rows[rows["failure_kind"] == FailureKind.INFRA].to_dict("records"):
                if (key := (row["instance_id"], int(row["rollout"]))) in infra:
                    self.retrying[key] = _history(row)
        return set(keys) - infra

    def add(self, result: RolloutResult) -> None:
        if result.key in self.retrying:
            result.attempts = self.retrying[result.key]
        self._buffer.append(result.row())
        now = time.monotonic()
        if self.flush_due() and now - self._flushed_at >= self.flush_s and now >= self._retry_at:
            self.flush()

    @property
    def waiting(self) -> int:
        """Finished rows not written yet."""
        return len(self._buffer)

    def flush_due(self) -> bool:
        """flush_every rows wait (held back when the last part file is younger than flush_s: the caller flushes
        them a flush_s later)."""
        return len(self._buffer) >= self.flush_every

    def flush(self) -> bool:
        """Write the waiting rows as one part file; True when none waits any more. A failed write (OSError) keeps
        them waiting and is logged (`write_error`); the caller retries."""
        if not self._buffer:
            return True
        try:
            write_part(self.dir, pa.Table.from_pylist(self._buffer, schema=RESULT_SCHEMA))
        except OSError as exc:
            self.failed_writes += 1
            self.write_error = f"{type(exc).__name__}: {exc}"
            self.failing_since = self.failing_since or time.monotonic()
            self._retry_at = time.monotonic() + RETRY_S
            log.error("results_write_failed", error=self.write_error, waiting=len(self._buffer),
                      failed_writes=self.failed_writes, results=str(self.dir))
            return False
        retried = {(r["instance_id"], r["rollout"]) for r in self._buffer} & set(self.retrying)
        if self.write_error is not None:
            log.warning("results_written_again", rows=len(self._buffer), failed_writes=self.failed_writes)
            self.write_error = self.failing_since = None
        self._buffer.clear()
        self._flushed_at = time.monotonic()
        if spilled_files(self.output_dir):  # an earlier run's spill (or a write that failed there): now it fits
            adopt(self.output_dir, self.dir, RESULT_SCHEMA)
        try:
            self.supersede(retried)  # the new rows are on disk: now the old ones go
        except OSError as exc:  # the old rows stay a while; `read` keeps the newer row of a key
            log.warning("supersede_failed", error=f"{type(exc).__name__}: {exc}")
        return True

    def finish(self) -> None:
        """At the end of a run, however it ended: write what waits, else spill it for the next run in this output
        dir (`check_written` then says so)."""
        if self.flush():
            return
        rows = len(self._buffer)
        try:
            path = spill(self.output_dir, pa.Table.from_pylist(self._buffer, schema=RESULT_SCHEMA))
        except OSError as exc:
            self.lost = rows
            log.error("results_lost", rows=rows, error=f"{type(exc).__name__}: {exc}", write_error=self.write_error)
            return
        self._buffer.clear()
        self.spilled = (rows, path.parent)
        log.error("results_spilled", rows=rows, spill=str(path.parent), write_error=self.write_error)

    def check_written(self) -> None:
        """ResultsNotWritten when this run ended without writing all it finished, or without starting rollouts
        because its writes kept failing."""
        if not (self.spilled or self.lost or self.not_started):
            return
        said = []
        if self.spilled:
            said.append(f"{self.spilled[0]} finished rollouts could not be written to {self.dir} ({self.write_error});"
                        f" they are kept in {self.spilled[1]}, and the next run with this output dir writes them "
                        "there first")
        if self.lost:
            said.append(f"{self.lost} finished rollouts could be written neither to {self.dir} ({self.write_error}) "
                        "nor to a spill, and are lost")
        if self.not_started:
            said.append(f"{self.not_started} rollouts did not start while results could not be written")
        raise ResultsNotWritten("; ".join(said) + ". Free space and rerun with the same output dir.")

    def read(self, columns: list[str] | None = None) -> pd.DataFrame:
        """Every rollout's row, one per key (the newest attempt). Part files written before a column existed read
        it as null."""
        files = self._files()
        if not files:
            return pd.DataFrame({f.name: pd.Series(dtype=object) for f in RESULT_SCHEMA}).loc[:, columns or slice(None)]
        wanted = None if columns is None else list(dict.fromkeys([*columns, *KEY, "attempts"]))
        frame = pa.concat_tables(pq.read_table(f, columns=wanted, schema=RESULT_SCHEMA) for f in files).to_pandas()
        if frame.duplicated(KEY).any():  # a crash between a retried row's write and `supersede`
            frame = (frame.assign(_n=frame["attempts"].map(_attempts))
                     .sort_values("_n", kind="stable").drop_duplicates(KEY, keep="last").drop(columns="_n")
                     .sort_index())
        return frame.reset_index(drop=True).loc[:, columns or slice(None)]

    def supersede(self, keys: set[tuple[str, int]]) -> int:
        """Remove the older rows of `keys` (rollouts run again and written anew, their row carrying one attempt
        more): each part file holding one is rewritten without it (temp file, then rename). Returns rows removed."""
        places: dict[tuple[str, int], list[tuple[int, Path, int]]] = {}
        for path in sorted(self.dir.glob("part-*.parquet")) if keys else []:
            table = pq.read_table(path, columns=[*KEY, "attempts"], schema=RESULT_SCHEMA)
            for i, (instance, rollout, attempts) in enumerate(zip(*(table[c].to_pylist() for c in table.column_names),
                                                                   strict=True)):
                if (instance, rollout) in keys:
                    places.setdefault((instance, rollout), []).append((_attempts(attempts), path, i))
        drop: dict[Path, set[int]] = {}
        for rows in places.values():
            for _, path, i in sorted(rows, key=lambda r: r[0])[:-1]:  # all but the row with the most attempts
                drop.setdefault(path, set()).add(i)
        for path, rows in drop.items():
            table = pq.read_table(path, schema=RESULT_SCHEMA)
            kept = table.filter(pa.array([i not in rows for i in range(table.num_rows)]))
            if kept.num_rows:
                tmp = path.with_name(f".{path.name}.tmp")
                pq.write_table(kept, tmp, compression="zstd")
                os.replace(tmp, path)
            else:
                path.unlink()
        return sum(map(len, drop.values()))

    def _files(self) -> list[Path]:
        """The part files of results/, and those an earlier run had to spill (uni_agent.driver.spill)."""
        return sorted(self.dir.glob("part-*.parquet")) + spilled_files(self.output_dir)


def _attempts(value: str | None) -> int:
    """How many earlier attempts a row records (its `attempts` JSON list)."""
    return len(json.loads(value)) if value else 0


def _history(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A replaced row's earlier attempts plus the row itself (without its token lists and its own history)."""
    earlier = json.loads(row.get("attempts") or "[]")
    kept = {k: v for k, v in row.items() if k not in TOKEN_COLUMNS and k != "attempts"}
    kept = {k: v.item() if hasattr(v, "item") else v for k, v in kept.items()}  # numpy scalars -> Python
    kept = {k: None if isinstance(v, float) and v != v else v for k, v in kept.items()}  # NaN of old files -> null
    return [*earlier, kept]


def recorded_rows(output_dir: str | Path) -> int:
    """How many rollouts the output dir holds (what a resumed run will not run again)."""
    if not (Path(output_dir) / "results").is_dir():
        return 0
    return len(ResultStore(output_dir).read(columns=KEY))
