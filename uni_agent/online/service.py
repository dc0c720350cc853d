"""The rollout service: a long-lived object a trainer calls step after step, over the same cluster, engines, agent
workers, sandboxes and rows as `uni_agent.run`.

    service = await RolloutService.start("agent.yaml", output_dir="outputs/rl", max_staleness=1)
    batch = await service.submit(rows, n=4, version=0, step=0)   # rows x n rollouts, running at once
    async for group in batch.groups(): ...                        # all n of a prompt, as each group completes
    await service.update_weights(1, "step1.gguf")                 # every replica on the new weights (weights.py)
    print(await service.stats())
    await service.close()

It is the driver's own parts (uni_agent.driver: pool, dispatch policy, dispatcher, Parquet store, dashboard events),
kept running between batches: one run directory per service (`results/` gains rows as rollouts finish, each with its
`step`, `policy_version`, and the version that sampled each token), one run id, one dashboard page. Every rollout gets a
rollout index unique within the service (the n of a row in a later batch continue the numbering), so rows never
replace each other in the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import structlog

from ..config import AgentConfigs, ConfigError
from ..driver.dataset import build_specs
from ..driver.inputs import agent_overrides, resolve_path
from ..driver.results import ResultStore
from ..driver.session import RunSession, open_session
from ..episode.exit_reason import ExitReason
from ..episode.rollout import RolloutResult, RolloutSpec
from ..events import RolloutState
from ..logs import configure_logging
from ..private_dirs import preflight, prepare_output_dir
from ..redact import register_secret
from ..settings import RunSettings, load_settings
from .batch import RolloutBatch
from .pool import VersionedPool
from .staleness import StaleAction, StalenessBound
from .weights import UpdateReport, update_engines

log = structlog.get_logger("uni_agent.online")
DEFAULT_OUTPUT_DIR = "outputs/service"


class RolloutService:
    def __init__(self) -> None:  # RolloutService.start builds one
        self.version = 0
        self.batches: list[RolloutBatch] = []
        self.tokens_per_version: Counter[int] = Counter()
        self.rollouts_per_version: Counter[int] = Counter()
        self.updates: list[dict[str, Any]] = []
        self._stale_restarts: Counter[tuple[str, int]] = Counter()
        self._next_rollout: Counter[str] = Counter()
        self._batch_of: dict[tuple[str, int], RolloutBatch] = {}
        self._updating = asyncio.Lock()
        self._stack = contextlib.AsyncExitStack()

    @classmethod
    async def start(cls, agent_config: str | Path | AgentConfigs | None = None, settings: RunSettings | None = None,
                    *, scheduler_address: str | None = None, version: int = 0, max_staleness: int | None = None,
                    stale_action: StaleAction = "mask", max_stale_restarts: int = 2, **overrides: Any
                    ) -> RolloutService:
        """Connect (a scheduler's address, else settings', else a new LocalCluster), start the engines and agent
        workers; `version` is the policy version of the weights the engines start with. overrides: RunSettings
        fields (output_dir, engine, model_path, agent_workers, max_turns, ...)."""
        self = cls()
        self.settings = settings = load_settings(settings, **{"progress": False, **overrides})
        self.bound = StalenessBound(max_staleness, stale_action, max_stale_restarts)
        self.version = version
        self.output_dir = settings.output_path(DEFAULT_OUTPUT_DIR)
        self.run_id = time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        agents = agent_config if isinstance(agent_config, AgentConfigs) else AgentConfigs.load(
            resolve_path(agent_config or settings.agent_config_path))
        self.agents = agents.override_all(agent_overrides(settings))  # as a batch run applies the run's settings
        register_secret(settings.api_key_value())
        log_dir = self.output_dir / "logs"
        preflight(self.output_dir if self.output_dir.exists() else None, share_with_group=settings.share_with_group)
        prepare_output_dir(self.output_dir, settings.share_with_group)
        configure_logging(log_dir, "driver", settings.log_level)
        self.model_path = settings.model_path
        if settings.engine == "llama_cpp" and self.model_path is None:
            from ..engines.llama_cpp import default_model_path

            self.model_path = default_model_path()
        self.store = ResultStore(self.output_dir, settings.flush_every)
        pool_factory = lambda client, engines, settings, log_dir: VersionedPool(  # noqa: E731
            client, engines, settings, log_dir, dict.fromkeys(engines.urls, version))
        try:
            session = await self._hold_session(log_dir, scheduler_address, pool_factory)
        except BaseException:
            await self._stack.aclose()
            raise
        self.client, self.engines, self.pool = session.client, session.engines, session.pool
        self.dispatcher = session.dispatcher
        self.dispatcher.review = self._review
        self._save()
        return self

    async def _hold_session(self, log_dir: Path, scheduler_address: str | None, pool_factory: Any) -> RunSession:
        """The run session, held open by a task of its own until close: a Client is entered and left in one task's
        context (its current-client variable), while a trainer may start and close the service from two."""
        ready: asyncio.Future[RunSession] = asyncio.get_running_loop().create_future()
        release = asyncio.Event()

        async def hold() -> None:
            try:
                async with open_session(self.settings, log_dir, self.store, scheduler_address=scheduler_address,
                                        pool_factory=pool_factory) as session:
                    ready.set_result(session)
                    await release.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc)
                raise

        holder = asyncio.ensure_future(hold())

        async def let_go() -> None:
            release.set()
            await holder
        self._stack.push_async_callback(let_go)
        return await ready

    # -- batches -----------------------------------------------------------------------------------------------------

    async def submit(self, rows: list[dict[str, Any]], n: int = 1, *, version: int | None = None,
                     step: int | None = None) -> RolloutBatch:
        """Start rows x n rollouts now and return their batch (results arrive on it as they finish). `version` is the
        policy version the trainer asks for (default: the current one), recorded on every row as policy_version;
        `step` the trainer's step (default: the batch's number). A row that is not valid is a ConfigError naming it,
        and nothing starts."""
        number = len(self.batches)
        specs, problems = build_specs(rows, self.agents, self.run_id, n, source=f"batch {number}")
        if problems:
            raise ConfigError("; ".join(p.error for p in problems))
        for i, spec in enumerate(specs):  # rollout indices unique within the service
            specs[i] = dataclasses.replace(spec, rollout=self._next_rollout[spec.instance_id])
            self._next_rollout[spec.instance_id] += 1
        batch = RolloutBatch(f"{self.run_id}-b{number}", number if step is None else step,
                             self.version if version is None else version, n, specs, self._cancel_on_actors)
        self.batches.append(batch)
        self.dispatcher.events.queued(specs)
        for spec in specs:
            self._batch_of[spec.key] = batch
            batch.track(spec, asyncio.ensure_future(self._run(spec)))
        return batch

    async def _run(self, spec: RolloutSpec) -> RolloutResult | None:
        try:
            result = await self.dispatcher.run_one(spec)
        except asyncio.CancelledError:
            self.dispatcher.events.state(spec, RolloutState.FAILED, error="cancelled by the trainer",
                                         exit_reason=ExitReason.CANCELLED)
            raise
        if result is not None:
            self.rollouts_per_version[result.policy_version] += 1
            self.tokens_per_version.update(v for v in result.token_versions if v >= 0)
        batch = self._batch_of.pop(spec.key)
        if batch.in_flight <= 1:  # the batch's last rollout: its rows go to disk now
            self.store.flush()
        return result

    def _review(self, spec: RolloutSpec, result: RolloutResult) -> bool:
        """The dispatcher's hook after each run of a rollout, before it is verified and recorded: the row's step
        and policy version, then the staleness bound. True: run the rollout again (restart)."""
        batch = self._batch_of[spec.key]
        result.step, result.policy_version = batch.step, batch.version
        restarts = self._stale_restarts[spec.key]
        decision = self.bound.decide(result, self.version, restarts)
        if decision == "restart":
            self._stale_restarts[spec.key] += 1
            log.info("stale_rollout_restarted", instance_id=spec.instance_id, rollout=spec.rollout,
                     version_min=result.version_min, current=self.version)
            return True
        result.stale_restarts = restarts
        if decision == "mask":
            self.bound.mask(result, self.version)
        elif restarts:
            result.staleness_action = "restarted"
        return False

    async def _cancel_on_actors(self, keys: list[tuple[str, int]]) -> int:
        counts = await self.pool.broadcast("cancel_rollouts", keys)
        return sum(c or 0 for c in counts)

    # -- weights -----------------------------------------------------------------------------------------------------

    async def update_weights(self, version: int, path: str | None = None, *, model_name: str | None = None,
                             lora: bool = False, drain_timeout: float = 30.0, preflight: bool = False,
                             timeout: float | None = None) -> UpdateReport:
        """Every engine replica serves `version` from `path` (a GGUF for llama_cpp; a checkpoint directory or LoRA
        adapter for vllm) or, for an external endpoint, under the served `model_name`. Rollouts in flight go on,
        their next tokens sampled by the new weights. A failure is an UpdateFailed, with the old version serving."""
        if version <= self.version:
            raise ValueError(f"update_weights: version {version} is not newer than the current {self.version}")
        async with self._updating:
            report = await update_engines(
                self.settings.engine, self.engines, self.pool, version=version, old_version=self.version,
                path=path, old_path=self.model_path, model_name=model_name, lora=lora, drain_timeout=drain_timeout,
                preflight=preflight, timeout=timeout or self.settings.engine_start_timeout)
            self.version = version
            if path is not None and not lora:
                self.model_path = path
            self.updates.append({"version": version, "path": path, "model_name": model_name, "at": time.time(),
                                 "seconds": round(report.seconds, 3), "max_pause_s": round(report.max_pause_s, 3)})
            self._save()
        return report

    # -- watching ----------------------------------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """In flight, per version (rollouts by the version asked for, sampled tokens by the version that sampled
        them), and each engine replica's load as the agent workers see it."""
        return {
            "run_id": self.run_id, "version": self.version,
            "in_flight": sum(b.in_flight for b in self.batches),
            "batches": [b.describe() for b in self.batches if not b.done],
            "rollouts_per_version": dict(sorted(self.rollouts_per_version.items())),
            "tokens_per_version": dict(sorted(self.tokens_per_version.items())),
            "engines": await self.pool.replica_load(),
            "updates": self.updates[-5:],
        }

    def _save(self) -> None:
        """service.json in the run directory: what the service is and the updates it made."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "service.json").write_text(json.dumps({
            "run_id": self.run_id, "engine": self.settings.engine, "urls": self.engines.urls,
            "model_name": self.engines.model_name, "model_path": self.model_path, "version": self.version,
            "max_staleness": self.bound.max_staleness, "stale_action": self.bound.action,
            "updates": self.updates}, indent=1))

    # -- the end -----------------------------------------------------------------------------------------------------

    async def close(self) -> None:
        """Cancel what still runs (its sandboxes close), write what finished, stop the workers and engines."""
        for batch in self.batches:
            with contextlib.suppress(Exception):
                await batch.cancel()
        try:
            await self.dispatcher.mailboxes.close()  # its events go with the agent workers, as the session closes
        finally:
            self.store.flush()
            await self._stack.aclose()

    async def __aenter__(self) -> RolloutService:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
