"""Results on disk: a Parquet dataset of part files under <output_dir>/results/, appended as rollouts finish.

Each flush writes a new part file atomically (temp name, then rename), so a crash loses at most the unflushed
results and never leaves a half-written file; a rerun reads the (instance_id, rollout) keys already present and
skips them."""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .rollout import RolloutResult

_ARROW_TYPES = {"str": pa.string(), "int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(),
                "str | None": pa.string()}
RESULT_SCHEMA = pa.schema(
    [pa.field(f.name, _ARROW_TYPES[str(f.type)]) for f in dataclasses.fields(RolloutResult)]
)


class ResultStore:
    def __init__(self, output_dir: str | Path, flush_every: int = 16):
        self.dir = Path(output_dir) / "results"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.flush_every = flush_every
        self._buffer: list[dict[str, Any]] = []

    def done_keys(self) -> set[tuple[str, int]]:
        frame = self.read(columns=["instance_id", "rollout"])
        return set(zip(frame["instance_id"], frame["rollout"].astype(int), strict=True))

    def add(self, result: RolloutResult) -> None:
        self._buffer.append(result.row())
        if len(self._buffer) >= self.flush_every:
            self.flush()

    def flush(self) -> None:
        if not self._buffer:
            return
        table = pa.Table.from_pylist(self._buffer, schema=RESULT_SCHEMA)
        name = f"part-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:8]}.parquet"
        tmp = self.dir / f".{name}.tmp"  # hidden from readers until renamed
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, self.dir / name)
        self._buffer.clear()

    def read(self, columns: list[str] | None = None) -> pd.DataFrame:
        files = sorted(self.dir.glob("part-*.parquet"))
        if not files:
            return pd.DataFrame({f.name: pd.Series(dtype=object) for f in RESULT_SCHEMA}).loc[:, columns or slice(None)]
        table = pa.concat_tables(pq.read_table(f, columns=columns, schema=RESULT_SCHEMA) for f in files)
        return table.to_pandas()
