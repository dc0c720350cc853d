"""A run session: what a run holds while it lasts (the cluster's client, the live page, the engines, the agent
workers and the dispatcher), assembled in one place for `run()`, the rollout service and `uni-agent verify`.

    async with open_session(settings, log_dir, store, first_spec=todo[0], rollouts_before_engines=True) as session:
        await session.guard(session.dispatcher.run(todo))

In order: the engine's name checked (with agents: uni_agent.engines.check_engine, a wrong one is a ConfigError
before anything starts), the cluster (cluster_client: a scheduler given, else a LocalCluster), the live page, every
worker's private directories checked (uni_agent.private_dirs.preflight_workers), the sandbox workers and where
verification goes; then, unless `agents=False` (verification needs no model), the engines, the agent workers' pool and
the dispatcher, and the agent workers started while the engines say what they are and read the agents' shared prompt.
With `rollouts_before_engines` (a batch run) the agent workers start while the engines start, and the session opens
then: the first wave's rollouts start their sandboxes while the engines load, and act once they are ready.
Everything is stopped in the reverse order on the way out, whatever ended the session."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog
from distributed import Client

from ..dashboard import UniAgentDashboard
from ..engines import Engines, check_engine, start_engines
from ..engines.base import Notify
from ..engines.shared_prompt import share_prompt
from ..episode.rollout import RolloutSpec
from ..gc_policy import full_collections_rare
from ..private_dirs import preflight_workers
from ..settings import RunSettings
from .cluster import cluster_client, sandbox_workers, verification_placement
from .dispatch import Dispatcher
from .manifest import engine_versions
from .policy import DispatchPolicy
from .pool import ActorPool
from .progress import run_phase
from .results import ResultStore

log = structlog.get_logger("uni_agent.driver.session")

T = TypeVar("T")
PoolFactory = Callable[[Client, Engines, RunSettings, Path], ActorPool]


@dataclass
class RunSession:
    settings: RunSettings
    client: Client
    workers: list[str]  # the sandbox workers: agents, sandboxes and verification go there
    placement: dict[str, Any]  # where verification futures go (keyword arguments of client.submit)
    engines: Engines | None = None
    pool: ActorPool | None = None
    dispatcher: Dispatcher | None = None
    engine_versions: list[dict[str, Any]] = field(default_factory=list)  # what each engine says it is (run.json)
    # with rollouts_before_engines: the engines' start, done once they serve and every agent worker knows them
    engines_ready: asyncio.Task[Engines] | None = None

    async def guard(self, work: Awaitable[T], notify: Notify | None = None,
                    on_engines: Callable[[Engines], None] | None = None) -> T:
        """`work`'s result (the dispatch, begun at once: its rollouts' sandboxes start while the engines do), under
        the engines' guard (Engines.guard) once they are ready; `on_engines` is called then. An engine start that
        fails cancels `work` and raises, as `work` that fails first raises without waiting for the engines."""
        task = asyncio.ensure_future(work)
        try:
            if self.engines_ready is not None and not self.engines_ready.done():
                await asyncio.wait({task, self.engines_ready}, return_when=asyncio.FIRST_COMPLETED)
                if not self.engines_ready.done():
                    return task.result()  # the work ended before the engines started: its error, or nothing to run
            engines = self.engines_ready.result() if self.engines_ready is not None else self.engines
            assert engines is not None
            if on_engines is not None:
                on_engines(engines)
            return await engines.guard(task, notify)
        finally:
            await _cancelled(task)


@contextlib.asynccontextmanager
async def open_session(settings: RunSettings, log_dir: Path, store: ResultStore | None = None, *,
                       scheduler_address: str | None = None, security: Any = None, agents: bool = True,
                       first_spec: RolloutSpec | None = None, pool_factory: PoolFactory = ActorPool,
                       rollouts_before_engines: bool = False) -> AsyncIterator[RunSession]:
    """The session; with `agents` (the default) also the engines, the pool (`pool_factory`) and a dispatcher that
    records into `store`. `first_spec`: a rollout whose opening request the engines read once for all their slots.
    `rollouts_before_engines`: the session opens once the agent workers started, the engines still starting
    (`session.engines_ready`); rollouts handed out then start their sandboxes and wait for the engines to act
    (uni_agent.episode.worker). `session.guard` runs the dispatch either way."""
    # (uni_agent.gc_policy) the rollout service and verify hold thousands of rollouts too
    with full_collections_rare():
        if agents:
            check_engine(settings)  # before the cluster starts: an unknown engine is the user's typo, said in one line
        async with cluster_client(settings, scheduler_address, security) as client:
            run_phase("connected")
            await _show_page(client)
            await preflight_workers(client)  # before an engine or a sandbox starts there
            workers = await sandbox_workers(client, settings.gpu_resource_name)
            session = RunSession(settings, client, workers, await verification_placement(client, workers))
            if not agents:
                yield session
                return
            if store is None:
                raise ValueError("a session with agents records into a ResultStore: pass store=")
            starting = asyncio.ensure_future(start_engines(client, settings, str(log_dir)))
            try:
                if not rollouts_before_engines:
                    session.engines = await starting
                session.pool = pool = pool_factory(client, session.engines, settings, log_dir)
                try:
                    policy = DispatchPolicy(settings.agent_workers or len(workers), settings.worker_wait_timeout)
                    session.dispatcher = Dispatcher(client, pool, policy, store, settings, session.placement)
                    if rollouts_before_engines:
                        # the engines start (a model loading: seconds for llama-server, minutes for vLLM) while the
                        # agent workers start and, once the caller hands rollouts out, the first wave's sandboxes
                        await session.dispatcher.start_actors(session.workers)
                        run_phase("agent_workers_started")
                        session.engines_ready = asyncio.ensure_future(_engines_ready(session, starting, first_spec))
                    else:
                        await _engines_ready(session, starting, first_spec)
                        run_phase("agent_workers_started")
                    yield session
                finally:
                    if session.engines_ready is not None:
                        await _cancelled(session.engines_ready)
                    if session.dispatcher is not None:
                        await session.dispatcher.close()  # its events, and the pool's actors
                    else:
                        await pool.close()
                        run_phase("agent_workers_closed")
            finally:
                await _cancelled(starting)
                if session.engines is not None:
                    await session.engines.stop()
                    run_phase("engines_stopped")


async def _engines_ready(session: RunSession, starting: asyncio.Future[Engines], first_spec: RolloutSpec | None
                         ) -> Engines:
    """The engines started, their opening prompt shared and every agent worker told: rollouts may call them.
    Without `rollouts_before_engines` the agent workers start here, while the engines read the shared prompt."""
    assert session.pool is not None and session.dispatcher is not None
    session.engines = engines = await starting
    # What each engine says it is, asked while the prompt is shared, not before.
    versions = asyncio.ensure_future(engine_versions(engines.urls, engines.api_key))
    try:
        print(f"engine: {engines.model_name} at {', '.join(engines.urls)}", file=sys.stderr)
        run_phase("engines_ready")
        sharing = _share_prompt(engines, first_spec, session.settings)
        if session.pool.engines is engines:  # the pool was made with them: its agent workers start now
            await engines.guard(_with_agent_workers(session, sharing))
        else:  # the agent workers started while the engines started
            # under the engine watch already: an engine's worker lost meanwhile is placed again, or ends the run
            # (EngineFailed), instead of leaving the share waiting on it
            await engines.guard(sharing)
            await session.pool.engines_ready(engines)
        session.engine_versions = await versions
    finally:
        versions.cancel()  # a session that ended before its engines answered
    return engines


async def _cancelled(task: asyncio.Future[Any]) -> None:
    """`task` ended: cancelled if it still runs, its outcome not raised here (its awaiter sees it)."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await task


async def _show_page(client: Client) -> None:
    try:  # the live page and metrics (a no-op when the scheduler has them); not worth failing a run for
        await client.register_plugin(UniAgentDashboard())
    except Exception as exc:
        log.warning("dashboard_not_registered", error=repr(exc))


async def _with_agent_workers(session: RunSession, sharing: Awaitable[None]) -> None:
    """The agent workers start (a second or two each: their imports) while the engines read the shared prompt."""
    assert session.dispatcher is not None
    shared = asyncio.ensure_future(sharing)
    try:
        await session.dispatcher.start_actors(session.workers)
    except BaseException:
        shared.cancel()
        raise
    await shared


async def _share_prompt(engines: Engines, spec: RolloutSpec | None, settings: RunSettings) -> None:
    """Every llama-server slot starts with the first rollout's opening request cached (its system prompt is every
    rollout's): the first wave does not read it once per slot. Only time is at stake, so a failure is a warning."""
    if spec is None or settings.engine != "llama_cpp" or not settings.engine_share_prompt:
        return
    from ..episode.agent_loop import opening_request

    request = opening_request(spec)
    if request is None:  # the agent builds its own requests (a harness program)
        return
    try:
        await share_prompt(engines.urls, engines.model_name, *request, api_key=engines.api_key)
    except httpx.HTTPError as exc:
        log.warning("prompt_not_shared", error=repr(exc))
