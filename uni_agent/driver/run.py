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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import structlog
from distributed import Client

from .config import AgentConfigs
from .dashboard import UniAgentDashboard
from .driver.dataset import RowProblem
from .driver.cluster import cluster_client, sandbox_workers, verification_placement
from .driver.dispatch import AgentWorkersLost, Dispatcher
from .driver.interrupt import RunInterrupted, run_until_stopped
from .driver.inputs import load_inputs
from .driver.policy import DispatchPolicy
from .driver.pool import ActorPool
from .engines import EngineFailed, Engines, start_engines
from .engines.shared_prompt import share_prompt
from .llm import token_capture_for
from .logs import configure_logging
from .driver.manifest import RunManifest, engine_versions
from .private_dirs import preflight, preflight_workers, prepare_output_dir, private_files
from .redact import register_secret
from .registry import import_object
from .driver.results import ResultsNotWritten, ResultStore, recorded_rows
from .episode.agent_loop import UniAgentLoop, first_request
from .episode.rollout import RolloutSpec
from .settings import RunSettings, load_settings
from .driver.summary import summarize
from .episode.trajectory import capture_note

__all__ = ["AgentWorkersLost", "EngineFailed", "ResultsNotWritten", "RunInterrupted", "RunOutcome", "run",
           "run_async"]
log = structlog.get_logger("uni_agent.runner")


@dataclass
class RunOutcome:
    results: pd.DataFrame
    summary: dict[str, Any]
    problems: list[RowProblem] = field(default_factory=list)


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
    with private_files(settings.share_with_group):
        return await _run(data, agent_config, settings, scheduler_address, security)


async def _run(data: str | Path | list[dict[str, Any]] | None, agent_config: str | Path | AgentConfigs | None,
               settings: RunSettings, scheduler_address: str | None, security: Any) -> RunOutcome:
    started = time.monotonic()
    output_dir = settings.output_path()
    log_dir = output_dir / "logs"
    register_secret(settings.api_key_value())
    # Every private directory is checked before anything is made or started: a squatted one ends the run here,
    # with one line naming it, instead of turning every rollout into an error row.
    preflight(output_dir if output_dir.exists() else None, share_with_group=settings.share_with_group)
    run_id = _run_id(output_dir)

    inputs = load_inputs(data, agent_config, settings, output_dir, run_id=run_id, n=settings.n, purpose="run")
    prepare_output_dir(output_dir, settings.share_with_group)
    agents, specs, problems = inputs.agents, inputs.specs, inputs.problems
    # Only a run that passed validation leaves logs/ and run.json (the manifest, below) behind.
    configure_logging(log_dir, "driver", settings.log_level)
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
    retried = f", {len(store.retrying)} of them infra failures run again" if store.retrying else ""
    print(f"uni-agent run {run_id}: {len(specs) // settings.n} tasks x n={settings.n} = {len(specs)} rollouts"
          f" ({len(specs) - len(todo)} already done in {output_dir}, {len(todo)} to run{retried})", file=sys.stderr)
    try:
        if todo:
            async with cluster_client(settings, scheduler_address, security) as client:
                await _run_rollouts(client, todo, settings, store, log_dir, manifest)
    finally:  # whatever ended the run, what finished is on disk for the rerun (or in a spill it writes first)
        store.finish()
    store.check_written()  # ResultsNotWritten: results kept in a spill, or rollouts not started for a full disk

    wanted = {s.key for s in specs}
    results = store.read()
    results = results[[k in wanted for k in zip(results["instance_id"], results["rollout"].astype(int))]]
    summary = summarize(results.reset_index(drop=True), num_tasks=len(specs) // settings.n, n=settings.n,
                        wall_seconds=time.monotonic() - started,
                        extra={"run_id": run_id, "rejected_rows": len(problems), "output_dir": str(output_dir)})
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if capture is not None and (note := capture_note(capture, settings.engine, results)) is not None:
        print(note, file=sys.stderr)
    manifest.finish(summary)
    return RunOutcome(results.reset_index(drop=True), summary, problems)


async def _share_prompt(engines: Engines, spec: RolloutSpec, settings: RunSettings) -> None:
    """Every llama-server slot starts with the first rollout's opening request cached (its system prompt is every
    rollout's): the first wave does not read it once per slot. Only time is at stake, so a failure is a warning."""
    if settings.engine != "llama_cpp" or not settings.engine_share_prompt:
        return
    if not issubclass(import_object(spec.agent.target), UniAgentLoop):  # a harness builds its own requests
        return
    try:
        await share_prompt(engines.urls, engines.model_name, *first_request(spec), api_key=engines.api_key)
    except httpx.HTTPError as exc:
        log.warning("prompt_not_shared", error=repr(exc))


def _run_id(output_dir: Path) -> str:
    """One run id per output dir, so a resumed run keeps its id: the one in run.json, else a new one."""
    marker = output_dir / "run.json"
    if marker.exists():
        return json.loads(marker.read_text())["run_id"]
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


async def _run_rollouts(client: Client, todo: list[RolloutSpec], settings: RunSettings, store: ResultStore,
                        log_dir: Path, manifest: RunManifest) -> None:
    try:  # the live page and metrics (a no-op when the scheduler has them); not worth failing a run for
        await client.register_plugin(UniAgentDashboard())
    except Exception as exc:
        log.warning("dashboard_not_registered", error=repr(exc))
    await preflight_workers(client)  # before an engine or a sandbox starts there
    engines = await start_engines(client, settings, str(log_dir))
    # What each engine says it is goes into run.json; asked while the agent workers start, not before.
    versions = asyncio.ensure_future(engine_versions(engines.urls, engines.api_key))
    pool = ActorPool(client, engines, settings, log_dir)
    try:
        print(f"engine: {engines.model_name} at {', '.join(engines.urls)}", file=sys.stderr)
        workers = await sandbox_workers(client, settings.gpu_resource_name)
        policy = DispatchPolicy(settings.agent_workers or len(workers), settings.worker_wait_timeout)
        dispatcher = Dispatcher(client, pool, policy, store, settings, await verification_placement(client, workers))
        sharing = asyncio.ensure_future(_share_prompt(engines, todo[0], settings))  # while the agent workers start
        try:
            await dispatcher.start_actors(workers)
        except BaseException:
            sharing.cancel()
            raise
        await sharing
        manifest.note(engines=await versions, model_name=engines.model_name)
        # an engine that keeps crashing ends the run (EngineFailed) instead of failing its rollouts one by one
        await engines.guard(dispatcher.run(todo), lambda level, message: dispatcher.events.notice(
            dispatcher.run_id, level, message))
    finally:
        versions.cancel()  # a run that ended before its engines answered
        await pool.close()
        await engines.stop()
