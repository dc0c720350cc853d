"""A run session: what a run holds while it lasts (the cluster's client, the live page, the engines, the agent
workers and the dispatcher), assembled in one place for `run()`, the rollout service and `uni-agent verify`.

    async with open_session(settings, log_dir, store, first_spec=todo[0]) as session:
        await session.dispatcher.run(todo)

In order: the engine's name checked (with agents: uni_agent.engines.check_engine, a wrong one is a ConfigError
before anything starts), the cluster (cluster_client: a scheduler given, else a LocalCluster), the live page, every
worker's private directories checked (uni_agent.private_dirs.preflight_workers), the sandbox workers and where
verification goes; then, unless `agents=False` (verification needs no model), the engines, the agent workers' pool and
the dispatcher, and the agent workers started while the engines say what they are and read the agents' shared prompt.
Everything is stopped in the reverse order on the way out, whatever ended the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import structlog
from distributed import Client

from ..dashboard import UniAgentDashboard
from ..engines import Engines, check_engine, start_engines
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


@contextlib.asynccontextmanager
async def open_session(settings: RunSettings, log_dir: Path, store: ResultStore | None = None, *,
                       scheduler_address: str | None = None, security: Any = None, agents: bool = True,
                       first_spec: RolloutSpec | None = None, pool_factory: PoolFactory = ActorPool
                       ) -> AsyncIterator[RunSession]:
    """The session; with `agents` (the default) also the engines, the pool (`pool_factory`) and a dispatcher that
    records into `store`. `first_spec`: a rollout whose opening request the engines read once for all their slots."""
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
            session.engines = engines = await start_engines(client, settings, str(log_dir))
            try:
                # What each engine says it is, asked while the agent workers start, not before.
                versions = asyncio.ensure_future(engine_versions(engines.urls, engines.api_key))
                session.pool = pool = pool_factory(client, engines, settings, log_dir)
                try:
                    print(f"engine: {engines.model_name} at {', '.join(engines.urls)}", file=sys.stderr)
                    policy = DispatchPolicy(settings.agent_workers or len(workers), settings.worker_wait_timeout)
                    session.dispatcher = Dispatcher(client, pool, policy, store, settings, session.placement)
                    # under the engine watch already: an engine's worker lost while the agent workers start is
                    # placed again, or ends the run (EngineFailed), instead of leaving a start-up call waiting on it
                    run_phase("engines_ready")
                    await engines.guard(_start_agent_workers(session, first_spec))
                    run_phase("agent_workers_started")
                    session.engine_versions = await versions
                    yield session
                finally:
                    versions.cancel()  # a session that ended before its engines answered
                    await pool.close()
                    run_phase("agent_workers_closed")
            finally:
                await engines.stop()
                run_phase("engines_stopped")


async def _show_page(client: Client) -> None:
    try:  # the live page and metrics (a no-op when the scheduler has them); not worth failing a run for
        await client.register_plugin(UniAgentDashboard())
    except Exception as exc:
        log.warning("dashboard_not_registered", error=repr(exc))


async def _start_agent_workers(session: RunSession, first_spec: RolloutSpec | None) -> None:
    """The agent workers start (a second or two each: their imports) while the engines read the shared prompt."""
    assert session.dispatcher is not None and session.engines is not None
    sharing = asyncio.ensure_future(_share_prompt(session.engines, first_spec, session.settings))
    try:
        await session.dispatcher.start_actors(session.workers)
    except BaseException:
        sharing.cancel()
        raise
    await sharing


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
