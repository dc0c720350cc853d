"""The driver: rows in, results out. Holds the Dask client, starts engines and agent workers, feeds rollouts,
verifies each finished rollout as a Dask future, writes Parquet as results arrive, and resumes a previous run.

    from uni_agent import run
    outcome = run("tasks.parquet", output_dir="outputs/demo", n=2)
    outcome.results   # pandas DataFrame, one row per rollout
    outcome.summary   # dict, also written to outputs/demo/summary.json
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import structlog
from distributed import Client, LocalCluster

from .config import AgentConfigs, ConfigError
from .dashboard import UniAgentDashboard, page_url
from .dataset import RowProblem, build_specs, read_rows
from .engines import start_engines
from .events import MAX_TRAJECTORY_CHARS, TOPIC, batch_event, rollout_event
from .failures import classify
from .llm import token_capture_for
from .mailbox import Mailboxes
from .logs import configure_logging
from .manifest import RunManifest, engine_versions
from .redact import redact, register_secret
from .results import ResultStore
from .rollout import RolloutResult, RolloutSpec
from .settings import REPO_ROOT, RunSettings, load_settings
from .summary import summarize
from .trajectory import capture_note
from .verify import Verification, verify_patch
from .worker import AgentWorker

log = structlog.get_logger("uni_agent.runner")
ACTOR_RETRIES = 2  # a rollout whose actor call failed (worker lost) runs again on another actor
ACTOR_START_TIMEOUT = 60.0  # an actor pinned to a worker that died before the scheduler noticed never starts


class AgentWorkersLost(RuntimeError):
    """Every agent worker was lost and no dask worker came back to host new ones. The results recorded so far are
    on disk; the rollouts that did not finish are not recorded, so a rerun with the same output dir runs them."""


@dataclass
class RunOutcome:
    results: pd.DataFrame
    summary: dict[str, Any]
    problems: list[RowProblem] = field(default_factory=list)


def resolve_path(path: str | Path) -> Path:
    """Paths in settings may be relative to the working directory or to the repository."""
    path = Path(path).expanduser()
    if path.exists() or path.is_absolute():
        return path
    return REPO_ROOT / path if (REPO_ROOT / path).exists() else path


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
    return asyncio.run(run_async(data, agent_config, settings, scheduler_address=address))


async def run_async(
    data: str | Path | list[dict[str, Any]] | None,
    agent_config: str | Path | AgentConfigs | None,
    settings: RunSettings,
    scheduler_address: str | None = None,
) -> RunOutcome:
    started = time.monotonic()
    output_dir = settings.output_path()
    log_dir = output_dir / "logs"
    register_secret(settings.api_key_value())
    run_id = _run_id(output_dir)

    agents = agent_config if isinstance(agent_config, AgentConfigs) else AgentConfigs.load(
        resolve_path(agent_config or settings.agent_config_path))
    if settings.max_turns is not None:
        agents = agents.override_all({"interaction": {"max_turns": settings.max_turns}})
    rows, source = _load_rows(data, settings, output_dir)
    if settings.max_samples >= 0:
        rows = rows[: settings.max_samples]
    specs, problems = build_specs(rows, agents, run_id, settings.n, source)
    for problem in problems:
        print(f"skipped: {problem.error}", file=sys.stderr)
    if not specs:
        raise ConfigError(f"{source}: no valid rows to run ({len(problems)} rejected)")
    # Only a run that passed validation leaves logs/ and run.json (the manifest, below) behind.
    configure_logging(log_dir, "driver", settings.log_level)
    for problem in problems:
        log.error("row_rejected", row=problem.row_index, instance_id=problem.instance_id, error=problem.error)
    manifest = RunManifest.begin(output_dir, run_id, settings, agents, source, rows, specs)  # run.json
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
            async with _cluster_client(settings, scheduler_address) as client:
                await _run_rollouts(client, todo, settings, store, log_dir, manifest)
    finally:  # whatever ended the run, what finished is on disk for the rerun
        store.flush()

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


def _run_id(output_dir: Path) -> str:
    """One run id per output dir, so a resumed run keeps its id: the one in run.json, else a new one."""
    marker = output_dir / "run.json"
    if marker.exists():
        return json.loads(marker.read_text())["run_id"]
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def _load_rows(data: Any, settings: RunSettings, output_dir: Path) -> tuple[list[dict[str, Any]], str]:
    if isinstance(data, list):
        return data, "rows"
    path = data or settings.data_path
    if path is None:  # the bundled tasks, converted on the fly
        from .tasks.swe_form import convert

        path = output_dir / "bundled_tasks.parquet"
        convert(None, path)
    path = resolve_path(path)
    return read_rows(path), str(path)


@contextlib.asynccontextmanager
async def _cluster_client(settings: RunSettings, scheduler_address: str | None) -> AsyncIterator[Client]:
    address = scheduler_address or settings.scheduler_address
    if address or settings.scheduler_file:
        kwargs = {"address": address} if address else {"scheduler_file": settings.scheduler_file}
        async with Client(asynchronous=True, **kwargs) as client:
            from .placement import wait_for_workers  # SLURM jobs may still be queued

            await wait_for_workers(client, settings.worker_wait_timeout, gpu_resource=settings.gpu_resource_name,
                                   gpus=settings.nnodes * settings.n_gpus_per_node if settings.engine == "vllm" else 0)
            _print_pages(client)
            yield client
        return
    async with contextlib.AsyncExitStack() as stack:
        cluster = await stack.enter_async_context(LocalCluster(
            n_workers=settings.local_workers, threads_per_worker=settings.threads_per_worker, processes=True,
            asynchronous=True, host="127.0.0.1", dashboard_address="127.0.0.1:8787",
            resources={"SANDBOX": 1024},
        ))
        if settings.engine == "vllm":  # this machine's GPUs as one GPU worker, apart from the sandbox workers
            from distributed import Nanny

            await stack.enter_async_context(Nanny(
                cluster.scheduler_address, nthreads=1, name="gpu-0", host="127.0.0.1", dashboard_address=":0",
                resources={settings.gpu_resource_name: settings.n_gpus_per_node}))
        client = await stack.enter_async_context(Client(cluster, asynchronous=True))
        _print_pages(client)
        yield client


def _print_pages(client: Client) -> None:
    """Where to watch: Dask's dashboard and the uni-agent page next to it (any scheduler: local, file, address)."""
    link = client.dashboard_link
    if not link:
        print("uni-agent page: none (the scheduler serves no dashboard; start it without --no-dashboard)",
              file=sys.stderr)
        return
    print(f"dask dashboard: {link}", file=sys.stderr)
    print(f"uni-agent page: {page_url(link)}", file=sys.stderr)


async def _run_rollouts(client: Client, todo: list[RolloutSpec], settings: RunSettings, store: ResultStore,
                        log_dir: Path, manifest: RunManifest | None = None) -> None:
    try:  # the live page and metrics (a no-op when the scheduler has them); not worth failing a run for
        await client.register_plugin(UniAgentDashboard())
    except Exception as exc:
        log.warning("dashboard_not_registered", error=repr(exc))
    engines = await start_engines(client, settings, str(log_dir))
    if manifest is not None:
        manifest.note(engines=await engine_versions(engines.urls, engines.api_key), model_name=engines.model_name)
    pool = _AgentPool(client, engines, settings, log_dir)
    try:
        print(f"engine: {engines.model_name} at {', '.join(engines.urls)}", file=sys.stderr)
        workers = await _sandbox_workers(client, settings.gpu_resource_name)
        for i in range(max(1, settings.agent_workers)):
            await pool.start_actor(workers[i % len(workers)])
        dispatcher = _Dispatcher(client, pool, store, settings, await verification_placement(client, workers))
        await dispatcher.run(todo)
    finally:
        await pool.close()
        await engines.stop()


class _AgentPool:
    """The AgentWorker actors of a run. An actor whose worker is gone is replaced by a new one on a live sandbox
    worker (a nanny-restarted worker, or one that joined later), waiting up to `worker_wait_timeout` for one."""

    def __init__(self, client: Client, engines: Any, settings: RunSettings, log_dir: Path):
        self.client, self.engines, self.settings, self.log_dir = client, engines, settings, log_dir
        self.actors: list[Any] = []
        self.futures: list[Any] = []  # an actor lives only while its future is referenced
        self._replacing = asyncio.Lock()

    async def start_actor(self, worker: str, timeout: float = ACTOR_START_TIMEOUT) -> Any:
        e = self.engines
        future = self.client.submit(
            AgentWorker, e.urls, e.model_name, e.api_key, self.settings.sampling(), self.settings.llm_timeout,
            str(self.log_dir), self.settings.log_level,
            token_capture=token_capture_for(self.settings.token_capture, self.settings.engine),
            actor=True, workers=[worker], key=f"agent-worker-{len(self.futures)}-{uuid.uuid4().hex[:8]}",
        )
        waiter = asyncio.ensure_future(_awaited(future))
        deadline = time.monotonic() + timeout
        try:
            # Pinned to one worker, the actor never starts if that worker dies first: give up as soon as the
            # scheduler no longer knows it, rather than at the deadline.
            while not (await asyncio.wait({waiter}, timeout=1.0))[0]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"agent worker did not start on {worker} within {timeout:g} s")
                if worker not in await self.live_workers():
                    raise RuntimeError(f"worker {worker} left before its agent worker started")
            actor = waiter.result()
        except BaseException:
            waiter.cancel()
            with contextlib.suppress(Exception):
                await self.client.cancel([future])
            raise
        self.futures.append(future)
        self.actors.append(actor)
        return actor

    async def live_workers(self) -> set[str]:
        try:
            return set((await self.client.scheduler.identity(n_workers=-1))["workers"])
        except Exception:  # cannot tell: count every actor as alive rather than drop it for a scheduler hiccup
            return {getattr(a, "_address", "") for a in self.actors}

    async def is_alive(self, actor: Any) -> bool:
        """Whether the scheduler still knows the worker that holds `actor` (a failed call alone does not say)."""
        return getattr(actor, "_address", None) in await self.live_workers()

    async def replace(self, lost: Any) -> bool:
        """Drop a lost actor (and any other whose worker is gone) and start replacements on live sandbox workers, up
        to `agent_workers` actors. Waits for a worker only when no actor is left; False when none came back within
        `worker_wait_timeout`."""
        async with self._replacing:  # many rollouts notice the same loss at once: replace once
            if lost in self.actors:
                self.actors.remove(lost)
                log.warning("agent_worker_lost", worker=getattr(lost, "_address", ""), actors_left=len(self.actors))
            live = await self.live_workers()
            self.actors = [a for a in self.actors if getattr(a, "_address", None) in live]
            if len(self.actors) >= max(1, self.settings.agent_workers):
                return True
            deadline = time.monotonic() + self.settings.worker_wait_timeout
            while True:
                with contextlib.suppress(RuntimeError):  # RuntimeError: no worker can take sandboxes (yet)
                    workers = await _sandbox_workers(self.client, self.settings.gpu_resource_name)
                    if workers:
                        held = [getattr(a, "_address", None) for a in self.actors]
                        worker = min(workers, key=held.count)  # the live worker holding the fewest actors
                        with contextlib.suppress(Exception):  # the worker may die before the actor is up
                            remaining = deadline - time.monotonic()
                            await self.start_actor(worker, min(ACTOR_START_TIMEOUT, max(5.0, remaining)))
                            log.warning("agent_worker_replaced", worker=worker)
                            return True
                if self.actors:
                    return True
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(1)

    async def close(self) -> None:
        for actor in self.actors:
            with contextlib.suppress(Exception):
                await actor.close()


async def _awaited(future: Any) -> Any:
    return await future


async def _sandbox_workers(client: Client, gpu_resource: str = "GPU") -> list[str]:
    """Workers that declare a SANDBOX resource; when none does, every worker that declares no GPUs. Agents and
    sandboxes go to a GPU worker only when it also declares SANDBOX (`--resources GPU=8,SANDBOX=32`)."""
    info = (await client.scheduler.identity(n_workers=-1))["workers"]
    tagged = sorted(addr for addr, w in info.items() if "SANDBOX" in (w.get("resources") or {}))
    untagged = sorted(addr for addr, w in info.items() if gpu_resource not in (w.get("resources") or {}))
    if tagged or untagged:
        return tagged or untagged
    raise RuntimeError(f"no dask worker can take agents and sandboxes ({len(info)} connected, all GPU workers): "
                       "start CPU workers with `dask worker --resources SANDBOX=N` (or declare SANDBOX=N on GPU workers)")


async def verification_placement(client: Client, workers: list[str]) -> dict[str, Any]:
    """Where verification futures go: by the SANDBOX resource where workers declare it (which also caps how many run
    at once per worker), else pinned to the sandbox workers. Asking for a resource no worker has would wait forever."""
    info = (await client.scheduler.identity(n_workers=-1))["workers"]
    if any("SANDBOX" in (info[addr].get("resources") or {}) for addr in workers if addr in info):
        return {"resources": {"SANDBOX": 1}}
    return {"workers": workers, "allow_other_workers": False}


class _Dispatcher:
    """Feeds rollouts to the least-busy agent worker, bounded by each agent's `concurrency`."""

    def __init__(self, client: Client, pool: _AgentPool, store: ResultStore, settings: RunSettings,
                 placement: dict[str, Any]):
        self.client, self.pool, self.store, self.settings = client, pool, store, settings
        self.in_flight: dict[int, int] = {}  # id(actor) -> rollouts running on it
        self.limits: dict[str, asyncio.Semaphore] = {}
        self.placement = placement
        self.progress = _Progress(settings.progress)
        self.not_run: list[RolloutSpec] = []  # rollouts left when every agent worker was lost
        self.mailboxes = Mailboxes()  # rollouts go to actors in batches, not one actor call each (uni_agent.mailbox)

    async def _emit(self, spec: RolloutSpec, state: str, **fields: Any) -> None:
        try:
            await self.client.log_event(TOPIC, rollout_event(spec.run_id, spec.instance_id, spec.rollout, state,
                                                             **fields))
        except Exception as exc:  # the dashboard is not worth a rollout
            log.warning("event_dropped", error=repr(exc))

    async def _emit_queued(self, todo: list[RolloutSpec], batch: int = 1000) -> None:
        """Every rollout's `queued`, a thousand to a message (one round trip to the scheduler per message)."""
        for start in range(0, len(todo), batch):
            events = [rollout_event(s.run_id, s.instance_id, s.rollout, "queued",
                                    max_turns=s.agent.interaction.max_turns) for s in todo[start:start + batch]]
            try:
                await self.client.log_event(TOPIC, batch_event(events))
            except Exception as exc:  # the dashboard is not worth a rollout
                log.warning("event_dropped", error=repr(exc))

    async def run(self, todo: list[RolloutSpec]) -> None:
        self.progress.start(len(todo))
        await self._emit_queued(todo)
        try:
            await asyncio.gather(*(self._one(spec) for spec in todo))
        finally:
            self.progress.close()
            await self.mailboxes.close()
        if self.not_run:
            raise AgentWorkersLost(
                f"every agent worker was lost and no dask worker came back within {self.settings.worker_wait_timeout:g}"
                f" s: {len(self.not_run)} of {len(todo)} rollouts did not finish and are not recorded; rerun with the "
                "same output dir to run them")

    async def _one(self, spec: RolloutSpec) -> None:
        limit = self.limits.setdefault(spec.agent.name, asyncio.Semaphore(spec.agent.concurrency))
        async with limit:
            self.progress.started()
            if self.settings.verify and spec.agent.reward.in_agent_sandbox:
                spec = dataclasses.replace(spec, grade_in_sandbox=True)
            try:
                result = await self._rollout(spec)
            except AgentWorkersLost:
                self.not_run.append(spec)
                await self._emit(spec, "failed", error="every agent worker was lost", exit_reason="error")
                return
            if self.settings.verify and not spec.grade_in_sandbox:
                await self._emit(spec, "verifying", worker=result.worker)
                await self._verify(spec, result)
        self.store.add(result)
        await self._emit(spec, "failed" if result.exit_reason == "error" else "done", **_final_fields(result))
        self.progress.update(result)
        log.info("rollout_recorded", instance_id=spec.instance_id, rollout=spec.rollout, reward=result.reward,
                 exit_reason=result.exit_reason)

    async def _rollout(self, spec: RolloutSpec) -> RolloutResult:
        last_error = ""
        for _attempt in range(ACTOR_RETRIES + 1):
            if not self.pool.actors and not await self.pool.replace(None):
                raise AgentWorkersLost()
            actor = min(self.pool.actors, key=lambda a: self.in_flight.get(id(a), 0))
            self.in_flight[id(actor)] = self.in_flight.get(id(actor), 0) + 1
            try:
                return await self.mailboxes.run(actor, spec)
            except Exception as exc:  # the actor or its worker failed, not the rollout: try another actor
                last_error = redact(f"{type(exc).__name__}: {exc}")
                log.warning("actor_call_failed", instance_id=spec.instance_id, rollout=spec.rollout,
                            error=last_error)
                if not await self.pool.is_alive(actor) and not await self.pool.replace(actor):
                    raise AgentWorkersLost() from exc
            finally:
                self.in_flight[id(actor)] -= 1
        return RolloutResult(spec.run_id, spec.instance_id, spec.rollout, spec.data_source, spec.agent.name,
                             exit_reason="error", error=f"agent worker failed: {last_error}", failure_kind="infra",
                             failure_cause=f"worker: {last_error}"[:2000])

    async def _verify(self, spec: RolloutSpec, result: RolloutResult) -> None:
        future = self.client.submit(
            verify_patch, spec.agent, result.patch, f"{spec.instance_id}-r{spec.rollout}-verify",
            pure=False, **self.placement, key=f"verify-{spec.instance_id}-r{spec.rollout}-"
            f"{uuid.uuid4().hex[:6]}",
        )
        # The grader bounds itself by eval_timeout once it runs; this bound also covers a future that never runs
        # or never reports (a lost worker, a stuck thread), so one rollout can never hold the run forever.
        deployment = spec.agent.env.deployment
        limit = spec.agent.reward.eval_timeout + deployment.startup_timeout * deployment.start_retries + 120
        try:
            verification: Verification = await asyncio.wait_for(future, limit)
        except TimeoutError:
            with contextlib.suppress(Exception):
                await self.client.cancel([future])
            verification = Verification(status="timeout", error=f"no verification result within {limit:g} s")
        except Exception as exc:
            verification = Verification(status="error", error=redact(f"{type(exc).__name__}: {exc}"))
        result.record(verification)
        classify(result)  # a grader that could not run is an infra failure, a wrong answer the model's


def _final_fields(result: RolloutResult) -> dict[str, Any]:
    """What the dashboard shows of a finished rollout (the trajectory clipped; the full one is in Parquet)."""
    fields = {k: getattr(result, k) for k in (
        "reward", "resolved", "exit_reason", "num_turns", "prompt_tokens", "completion_tokens", "sandbox_start_s",
        "llm_s", "tools_s", "verify_s", "total_s", "worker", "error")}
    fields["error_kind"] = result.error.split(":", 1)[0] if result.error else None
    fields["messages"] = _clip_messages(result.messages, MAX_TRAJECTORY_CHARS)
    fields["verification"] = result.verification[:MAX_TRAJECTORY_CHARS]
    return fields


def _clip_messages(messages_json: str, limit: int) -> str:
    """The trajectory as valid JSON within `limit` characters: the first messages that fit, then a note."""
    if len(messages_json) <= limit:
        return messages_json
    kept, size = [], 0
    messages = json.loads(messages_json)
    for message in messages:
        size += len(json.dumps(message, ensure_ascii=False)) + 2
        if size > limit - 200:
            break
        kept.append(message)
    kept.append({"role": "note", "content": f"{len(messages) - len(kept)} later messages are in the Parquet results"})
    return json.dumps(kept, ensure_ascii=False)


class _Progress:
    """The terminal line: done/total, ETA and rate (tqdm), plus rollouts running now, mean reward so far, errors."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar: Any = None
        self.done = self.errors = self.running = 0
        self.reward_sum = 0.0

    def start(self, total: int) -> None:
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="rollout", file=sys.stderr, dynamic_ncols=True)

    def started(self) -> None:
        self.running += 1
        self._show()

    def update(self, result: RolloutResult) -> None:
        self.running -= 1
        self.done += 1
        self.reward_sum += result.reward
        self.errors += result.exit_reason == "error"
        if self.bar is not None:
            self.bar.update(1)
        self._show()

    def _show(self) -> None:
        if self.bar is not None:
            reward = f"{self.reward_sum / self.done:.3f}" if self.done else "-"
            self.bar.set_postfix(running=self.running, reward=reward, errors=self.errors)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
