"""The Python API of a run: rows in, results out. `run` loads the inputs, connects to the cluster, starts the engines
and the agent workers, dispatches every rollout (verifying each as a Dask future), writes Parquet as results arrive,
and resumes a previous run in the same output dir. The parts are in uni_agent.driver.

    from uni_agent import run
    outcome = run("tasks.parquet", output_dir="outputs/demo", n=2)
    outcome.results   # pandas DataFrame, one row per rollout
    outcome.summary   # dict, also written to outputs/demo/summary.json
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import structlog

from ..config import AgentConfigs
from ..engines import EngineFailed, check_engine
from ..episode.exit_reason import ExitReason
from ..episode.rollout import RolloutSpec
from ..episode.trajectory import capture_note
from ..gc_policy import full_collections_rare
from ..llm import token_capture_for
from ..logs import configure_logging
from ..private_dirs import preflight, prepare_output_dir, private_files
from ..redact import register_secret
from ..settings import RunSettings, load_settings
from .dataset import RowProblem
from .dispatch import AgentWorkersLost
from .inputs import load_inputs
from .interrupt import RunInterrupted, run_until_stopped
from .manifest import RunManifest
from .progress import run_phase
from .results import ResultsNotWritten, ResultStore, recorded_rows
from .session import open_session
from .summary import summarize

__all__ = ["AgentWorkersLost", "EngineFailed", "ResultsNotWritten", "RunInterrupted", "RunOutcome", "run",
           "run_async"]
log = structlog.get_logger("uni_agent.driver.run")
OUTAGE_RERUNS = 2  # times a rollout that waited out an engine outage runs again within the run


# What the summary and the token-capture note read; the conversations, patches and token lists are most of a large
# run's bytes (100,000 rows: seconds to load into pandas), and the command line never reads them.
SUMMARY_COLUMNS = ["instance_id", "rollout", "reward", "resolved", "exit_reason", "error", "failure_kind",
                   "failure_cause", "sandbox_start_s", "llm_s", "tools_s", "verify_s", "total_s", "tokens_missing"]


class RunOutcome:
    """A run's rows (`results`, a DataFrame with one row per rollout, read from the output dir the first time it is
    asked for when the run passed a reader instead), its summary and the rows it rejected."""

    def __init__(self, results: pd.DataFrame | Callable[[], pd.DataFrame], summary: dict[str, Any],
                 problems: list[RowProblem] | None = None):
        self._results, self.summary, self.problems = results, summary, problems or []

    @property
    def results(self) -> pd.DataFrame:
        if callable(self._results):
            self._results = self._results()
        return self._results


def run(
    data: str | Path | list[dict[str, Any]] | None = None,
    agent_config: str | Path | AgentConfigs | None = None,
    settings: RunSettings | None = None,
    client: Client | None = None,
    **overrides: Any,
) -> RunOutcome:
    """Run every row × n rollouts and return the results. Blocking; see `run_async` inside an event loop.

    data: a Parquet path or a list of rows in the seed schema (default: settings.data_path, else the bundled tasks).
    agent_config: a YAML path or loaded AgentConfigs (default: settings.agent_config_path).
    client: an existing distributed Client whose scheduler to use (default: settings' scheduler, else a LocalCluster).
    overrides: any RunSettings field, e.g. n=2, output_dir="outputs/x".
    """
    settings = load_settings(settings, **overrides)
    address = client.scheduler.address if client is not None else None
    security = client.security if client is not None else None  # the run connects anew: with the same credentials
    try:
        return run_until_stopped(run_async(data, agent_config, settings, scheduler_address=address,
                                           security=security))
    except RunInterrupted as stop:  # say how many rows the output dir holds now
        output_dir = settings.output_path()
        raise RunInterrupted(stop.signum, recorded_rows(output_dir), str(output_dir)) from None


async def run_async(
    data: str | Path | list[dict[str, Any]] | None,
    agent_config: str | Path | AgentConfigs | None,
    settings: RunSettings,
    scheduler_address: str | None = None,
    security: Any = None,
) -> RunOutcome:
    # full_collections_rare: the driver holds every row, spec and future of the run (uni_agent.gc_policy)
    with private_files(settings.share_with_group), full_collections_rare():
        return await _run(data, agent_config, settings, scheduler_address, security)


async def _run(data: str | Path | list[dict[str, Any]] | None, agent_config: str | Path | AgentConfigs | None,
               settings: RunSettings, scheduler_address: str | None, security: Any) -> RunOutcome:
    started = time.monotonic()
    output_dir = settings.output_path()
    log_dir = output_dir / "logs"
    register_secret(settings.api_key_value())
    check_engine(settings)  # settings know no engine: its name is checked here, before anything is made
    # Every private directory is checked before anything is made or started: a squatted one ends the run here,
    # with one line naming it, instead of turning every rollout into an error row.
    preflight(output_dir if output_dir.exists() else None, share_with_group=settings.share_with_group)
    run_id = _run_id(output_dir)

    inputs = load_inputs(data, agent_config, settings, output_dir, run_id=run_id, n=settings.n, purpose="run")
    prepare_output_dir(output_dir, settings.share_with_group)
    agents, specs, problems = inputs.agents, inputs.specs, inputs.problems
    # Only a run that passed validation leaves logs/ and run.json (the manifest, below) behind.
    configure_logging(log_dir, "driver", settings.log_level)
    run_phase("inputs_loaded", rows=len(inputs.rows), rollouts=len(specs), seconds=round(time.monotonic() - started, 3))
    for problem in problems:
        log.error("row_rejected", row=problem.row_index, instance_id=problem.instance_id, error=problem.error)
    manifest = RunManifest.begin(output_dir, run_id, settings, agents, inputs.source, inputs.rows, specs)  # run.json
    capture = token_capture_for(settings.token_capture, settings.engine)
    if (note := capture_note(capture, settings.engine)) is not None:
        print(note, file=sys.stderr)  # once per run, not per rollout
    manifest.note(token_capture=capture)

    store = ResultStore(output_dir, settings.flush_every)
    done = store.done_keys(retry_infra=settings.retry_errors)  # --retry-errors: infra rows are not done
    todo = [s for s in specs if s.key not in done]
    run_phase("results_read", done=len(specs) - len(todo))
    retried = f", {len(store.retrying)} of them infra failures run again" if store.retrying else ""
    print(f"uni-agent run {run_id}: {len(specs) // settings.n} tasks x n={settings.n} = {len(specs)} rollouts"
          f" ({len(specs) - len(todo)} already done in {output_dir}, {len(todo)} to run{retried})", file=sys.stderr)
    try:
        if todo:
            await _run_rollouts(todo, settings, store, log_dir, manifest, scheduler_address, security)
    finally:  # whatever ended the run, what finished is on disk for the rerun (or in a spill it writes first)
        store.finish()
        run_phase("session_closed")
    store.check_written()  # ResultsNotWritten: results kept in a spill, or rollouts not started for a full disk

    wanted = {s.key for s in specs}

    def this_runs(columns: list[str] | None) -> pd.DataFrame:  # the output dir may hold an earlier run's other rows
        frame = store.read(columns=columns)
        keys = zip(frame["instance_id"], frame["rollout"].astype(int), strict=True)
        return frame[[k in wanted for k in keys]].reset_index(drop=True)

    results = this_runs(SUMMARY_COLUMNS)
    summary = summarize(results, num_tasks=len(specs) // settings.n, n=settings.n,
                        wall_seconds=time.monotonic() - started,
                        extra={"run_id": run_id, "rejected_rows": len(problems), "output_dir": str(output_dir)})
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    run_phase("summary_written")
    if capture is not None and (note := capture_note(capture, settings.engine, results)) is not None:
        print(note, file=sys.stderr)
    manifest.finish(summary)
    return RunOutcome(lambda: this_runs(None), summary, problems)


def rerun_engine_outages(limit: int = OUTAGE_RERUNS) -> Callable[[RolloutSpec, Any], bool]:
    """The dispatcher's review: a rollout that ran out of time while every engine was down (exit reason engine_down,
    an infra row) runs again in this run, at most `limit` times, once an engine serves again (the engine watch
    places a lost one elsewhere); an engine down for good ends the run instead (EngineFailed)."""
    reruns: Counter[tuple[str, int]] = Counter()

    def review(spec: RolloutSpec, result: Any) -> bool:
        if result.exit_reason != ExitReason.ENGINE_DOWN or reruns[spec.key] >= limit:
            return False
        reruns[spec.key] += 1
        return True
    return review


def _run_id(output_dir: Path) -> str:
    """One run id per output dir, so a resumed run keeps its id: the one in run.json, else a new one."""
    marker = output_dir / "run.json"
    if marker.exists():
        return json.loads(marker.read_text())["run_id"]
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


async def _run_rollouts(todo: list[RolloutSpec], settings: RunSettings, store: ResultStore, log_dir: Path,
                        manifest: RunManifest, scheduler_address: str | None, security: Any) -> None:
    async with open_session(settings, log_dir, store, scheduler_address=scheduler_address, security=security,
                            first_spec=todo[0], rollouts_before_engines=True) as session:
        dispatcher = session.dispatcher
        assert dispatcher is not None
        dispatcher.review = rerun_engine_outages()

        def engines_ready(engines: Any) -> None:
            manifest.note(engines=session.engine_versions, model_name=engines.model_name)
        # The rollouts go out at once: the first wave's sandboxes start while the engines start. Then an engine that
        # keeps crashing ends the run (EngineFailed) instead of failing its rollouts one by one.
        await session.guard(dispatcher.run(todo), lambda level, message: dispatcher.events.notice(
            dispatcher.run_id, level, message), on_engines=engines_ready)
