"""The one input loader of `run` and `verify`: agent configs, rows, and the rollout specs built from them, checked
before anything starts (rejected rows are printed; no valid row at all is a ConfigError)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import AgentConfigs, ConfigError
from .dataset import RowProblem, build_specs, read_rows
from ..episode.rollout import RolloutSpec
from ..settings import REPO_ROOT, RunSettings


# The run settings that reach every agent, and where: merged over each row's tools_kwargs when set (the run wins).
AGENT_SETTINGS = {"max_turns": ("interaction", "max_turns"), "eval_timeout": ("reward", "eval_timeout")}


def agent_overrides(settings: RunSettings) -> dict[str, Any]:
    """The agent config keys the run's settings set (those not None), nested as in the YAML."""
    overrides: dict[str, Any] = {}
    for name, (section, key) in AGENT_SETTINGS.items():
        if getattr(settings, name) is not None:
            overrides.setdefault(section, {})[key] = getattr(settings, name)
    return overrides


@dataclass
class Inputs:
    agents: AgentConfigs
    rows: list[dict[str, Any]]
    source: str  # the Parquet path, or "rows" for rows passed in from Python
    specs: list[RolloutSpec]
    problems: list[RowProblem]  # the rows rejected, each with why


def resolve_path(path: str | Path) -> Path:
    """Paths in settings may be relative to the working directory or to the repository."""
    path = Path(path).expanduser()
    if path.exists() or path.is_absolute():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


def load_inputs(data: str | Path | list[dict[str, Any]] | None, agent_config: str | Path | AgentConfigs | None,
                settings: RunSettings, output_dir: Path, *, run_id: str, n: int, purpose: str) -> Inputs:
    """`n` specs per row (the first `max_samples` rows); `purpose` ("run", "verify") words the error of no valid row."""
    agents = agent_config if isinstance(agent_config, AgentConfigs) else AgentConfigs.load(
        resolve_path(agent_config or settings.agent_config_path))
    agents = agents.override_all(agent_overrides(settings))
    rows, source = load_rows(data, settings, output_dir)
    if settings.max_samples >= 0:
        rows = rows[: settings.max_samples]
    if settings.build_envs:
        from ..envs.first_use import with_environments  # builds only when asked: no envs code otherwise

        rows = with_environments(rows, git_mirror=settings.git_mirror)
    specs, problems = build_specs(rows, agents, run_id, n, source)
    for problem in problems:
        print(f"skipped: {problem.error}", file=sys.stderr)
    if not specs:
        raise ConfigError(f"{source}: no valid rows to {purpose} ({len(problems)} rejected)")
    return Inputs(agents, rows, source, specs, problems)


def load_rows(data: str | Path | list[dict[str, Any]] | None, settings: RunSettings,
              output_dir: Path) -> tuple[list[dict[str, Any]], str]:
    """Rows passed in, else the Parquet file `data` or settings.data_path, else the bundled tasks (converted into
    output_dir on the fly)."""
    if isinstance(data, list):
        return data, "rows"
    path = data or settings.data_path
    if path is None:
        from ..tasks.swe_form import convert

        path = output_dir / "bundled_tasks.parquet"
        convert(None, path)
    path = resolve_path(path)
    return read_rows(path), str(path)
