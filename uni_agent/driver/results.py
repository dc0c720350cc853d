"""Results on disk: a Parquet dataset of part files under <output_dir>/results/, appended as rollouts finish.

Each flush writes a new part file atomically (temp name, then rename), so a crash loses at most the unflushed
results and never leaves a half-written file; a rerun reads the (instance_id, rollout) keys already present and
skips them. A rollout run again (--retry-errors) is written first and its old row removed after (`supersede`), so a
crash in between leaves two rows for a key, of which `read` keeps the newer one: a key never has two rows. Rows written
by older versions read in today's names (`migrate_rows`)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from ..episode.exit_reason import OLD_EXIT_REASONS, migrate_exit_reason
from ..episode.rollout import TOKEN_COLUMNS, RolloutResult

_ARROW_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
                "str | None": pa.string()}


def _arrow_type(f: dataclasses.Field) -> pa.DataType:
    # Token lists are narrow (int32 ids and masks, float32 logprobs): they are most of a row's bytes.
    if f.name in TOKEN_COLUMNS:
        return pa.list_(pa.from_numpy_dtype(TOKEN_COLUMNS[f.name]))
    return _ARROW_TYPES[str(f.type)]


RESULT_SCHEMA = pa.schema([pa.field(f.name, _arrow_type(f)) for f in dataclasses.fields(RolloutResult)])
KEY = ["instance_id", "rollout"]


class ResultStore:
    def __init__(self, output_dir: str | Path, flush_every: int = 16, flush_s: float = 1.0):
        self.dir = Path(output_dir) / "results"
        self.dir.mkdir(parents=True, exist_ok=True)
        # A part file holds at least flush_every rows, and a burst of results (a wave finishing together) makes at
        # most one a flush_s: 20,000 results written 16 at a time cost seconds of the driver's loop after the work.
        self.flush_every, self.flush_s = flush_every, flush_s
        self._flushed_at = -float("inf")  # the first part file is not held back
        self._buffer: list[dict[str, Any]] = []
        self.retrying: dict[tuple[str, int], list[dict[str, Any]]] = {}  # key -> its earlier attempts

    def done_keys(self, retry_infra: bool = False) -> set[tuple[str, int]]:
        """Keys already recorded. With `retry_infra`, rows whose failure_kind is infra do not count as done: they
        run again, and the new row records the old ones in `attempts`."""
        frame = self.read(columns=[*KEY, "failure_kind"] if retry_infra else KEY)
        keys = list(zip(frame["instance_id"], frame["rollout"].astype(int), strict=True))
        if not retry_infra:
            return set(keys)
        infra = set(k for k, kind in zip(keys, frame["failure_kind"], strict=True) if kind == "infra")
        if infra:
            rows = self.read()
            for row in rows[rows["failure_kind"] == "infra"].to_dict("records"):
                self.retrying[(row["instance_id"], int(row["rollout"]))] = _history(row)
        return set(keys) - infra

    def add(self, result: RolloutResult) -> None:
        if result.key in self.retrying:
            result.attempts = json.dumps(self.retrying[result.key], ensure_ascii=False, default=str)
        self._buffer.append(result.row())
        if self.flush_due() and time.monotonic() - self._flushed_at >= self.flush_s:
            self.flush()

    def flush_due(self) -> bool:
        """flush_every rows wait (held back when the last part file is younger than flush_s: the caller flushes
        them a flush_s later)."""
        return len(self._buffer) >= self.flush_every

    def flush(self) -> None:
        if not self._buffer:
            return
        table = pa.Table.from_pylist(self._buffer, schema=RESULT_SCHEMA)
        name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.dir / f".{name}.tmp"  # hidden from readers until renamed
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, self.dir / name)
        retried = {(r["instance_id"], r["rollout"]) for r in self._buffer} & set(self.retrying)
        self._buffer.clear()
        self._flushed_at = time.monotonic()
        self.supersede(retried)  # the new rows are on disk: now the old ones go

    def read(self, columns: list[str] | None = None) -> pd.DataFrame:
        """Every rollout's row, one per key (the newest attempt). Part files written before a column existed read
        it as null; older exit reasons read in today's names (`migrate_rows`)."""
        files = self._files()
        if not files:
            return pd.DataFrame({f.name: pd.Series(dtype=object) for f in RESULT_SCHEMA}).loc[:, columns or slice(None)]
        # an old exit reason's new name depends on the row's error text (uni_agent.episode.exit_reason)
        needs = ["error"] if columns is not None and "exit_reason" in columns else []
        wanted = None if columns is None else list(dict.fromkeys([*columns, *KEY, "attempts", *needs]))
        frame = pa.concat_tables(pq.read_table(f, columns=wanted, schema=RESULT_SCHEMA) for f in files).to_pandas()
        if frame.duplicated(KEY).any():  # a crash between a retried row's write and `supersede`
            frame = (frame.assign(_n=frame["attempts"].map(_attempts))
                     .sort_values("_n", kind="stable").drop_duplicates(KEY, keep="last").drop(columns="_n")
                     .sort_index())
        return migrate_rows(frame).reset_index(drop=True).loc[:, columns or slice(None)]

    def supersede(self, keys: set[tuple[str, int]]) -> int:
        """Remove the older rows of `keys` (rollouts run again and written anew, their row carrying one attempt
        more): each part file holding one is rewritten without it (temp file, then rename). Returns rows removed."""
        places: dict[tuple[str, int], list[tuple[int, Path, int]]] = {}
        for path in self._files() if keys else []:
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
        return sorted(self.dir.glob("part-*.parquet"))


def migrate_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the exit reasons older versions wrote renamed to today's (uni_agent.episode.exit_reason), in
    exit_reason and in the failure_cause that repeats it: a copy when it held any, else `frame` itself."""
    if "exit_reason" not in frame or not frame["exit_reason"].isin(OLD_EXIT_REASONS).any():
        return frame
    errors = frame["error"] if "error" in frame else pd.Series(None, index=frame.index, dtype=object)
    renamed = {column: [migrate_exit_reason(value, error) for value, error in zip(frame[column], errors, strict=True)]
               for column in ("exit_reason", "failure_cause") if column in frame}
    return frame.assign(**renamed)


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
