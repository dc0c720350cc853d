"""Reading dataset rows (the seed schema) and turning them into rollout specs, with errors that name the row."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..config import AgentConfigs, ConfigError
from ..episode.rollout import RolloutSpec
from ..grading import check_reward_config

REQUIRED_COLUMNS = ("prompt", "agent_name", "extra_info")


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path).expanduser()
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: data file not found") from None
    except (pa.ArrowInvalid, OSError) as exc:
        raise ConfigError(f"{path}: not a readable Parquet file ({exc})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
    if missing:
        raise ConfigError(f"{path}: missing columns {missing}; found {table.column_names}")
    return table.to_pylist()


def _drop_nones(value: Any) -> Any:
    # Parquet struct columns hold the union of all rows' keys; absent keys read back as None.
    if isinstance(value, dict):
        return {k: _drop_nones(v) for k, v in value.items() if v is not None}
    return value


def _as_dict(value: Any, where: str, field: str) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{where}: {field} is not valid JSON: {exc}") from None
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {field} must be a mapping, got {type(value).__name__}")
    return value


@dataclass
class RowProblem:
    row_index: int
    instance_id: str
    error: str


def build_specs(
    rows: list[dict[str, Any]], agents: AgentConfigs, run_id: str, n: int, source: str = "rows"
) -> tuple[list[RolloutSpec], list[RowProblem]]:
    """n specs per valid row; invalid rows are reported (with index and instance id) and skipped."""
    specs: list[RolloutSpec] = []
    problems: list[RowProblem] = []
    seen: set[str] = set()
    checked: set[int] = set()  # id() of agent configs whose reward passed: rows without tools_kwargs share one
    for index, row in enumerate(rows):
        instance_id = str(row.get("instance_id") or (row.get("extra_info") or {}).get("instance_id") or f"row-{index}")
        where = f"{source} row {index} (instance_id={instance_id})"
        try:
            if instance_id in seen:
                raise ConfigError(f"{where}: duplicate instance_id")
            extra_info = _as_dict(row.get("extra_info"), where, "extra_info")
            tools_kwargs = _drop_nones(_as_dict(extra_info.get("tools_kwargs"), where, "extra_info.tools_kwargs"))
            prompt = row.get("prompt")
            if isinstance(prompt, str):  # a JSON-encoded message list is accepted too
                try:
                    prompt = json.loads(prompt)
                except json.JSONDecodeError:
                    raise ConfigError(f"{where}: prompt must be a list of chat messages, got a plain string") from None
            if not isinstance(prompt, list) or not all(isinstance(m, dict) and "role" in m for m in prompt):
                raise ConfigError(f"{where}: prompt must be a list of chat messages with `role` and `content`")
            agent_name = row.get("agent_name")
            if not isinstance(agent_name, str):
                raise ConfigError(f"{where}: agent_name must be a string")
            agent = agents.for_row(agent_name, tools_kwargs, where)
            if id(agent) not in checked:  # (each id a config the specs keep alive: never one reused)
                check_reward_config(agent, where)
                checked.add(id(agent))
        except ConfigError as exc:
            problems.append(RowProblem(index, instance_id, str(exc)))
            continue
        seen.add(instance_id)
        messages = [{"role": m["role"], "content": m.get("content") or ""} for m in prompt]
        data_source = str(row.get("data_source") or "unknown")
        specs.extend(
            RolloutSpec(run_id, instance_id, k, data_source, index, messages, agent) for k in range(n)
        )
    return specs, problems
