"""The agent worker: a lightweight Dask actor that runs many rollouts as async loops on its worker's event loop.

Nothing here blocks: sandboxes are asyncio subprocesses and the LLM client is async. The driver decides how many
rollouts each worker runs at once; the Router picks the least-loaded engine replica for each new rollout, and the
rollout keeps that replica for all its turns, which keeps the server's prefix cache warm, unless the replica dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from ..current_worker import worker_address
from ..events import worker_emitter
from ..gc_policy import make_full_collections_rare
from ..grading import grade_in_sandbox
from ..llm import ChatClient, ChatReply, EndpointDownError, LLMError
from ..logs import configure_logging
from ..redact import register_secret
from ..sandbox import Sandbox
from ..sandbox.start import start_sandbox
from .agent_loop import strategy_for
from .envelope import SandboxOpener, run_episode, sandbox_closer, sandbox_name, started_or_stopped
from .replica_versions import ReplicaVersions
from .rollout import Batch, Finished, Outcome, Raised, RolloutResult, RolloutSpec
from .strategy import AgentStrategy

log = structlog.get_logger("uni_agent.worker")
CLOSE_WAIT_S = 60.0  # how long close() waits for cancelled rollouts and the sandboxes still closing
ORPHAN_AFTER_S = 120.0  # no collect call for this long: the driver is gone (uni_agent.driver.mailbox polls every 2 s)


class AgentWorker:
    """`urls` empty: the engines are still starting. Rollouts handed over before `set_engines` start their sandboxes
    at once and begin acting (their wall clock with them) when the engines are ready: the first wave's sandbox starts
    overlap the engines' start (a model loading, a prompt being shared) instead of following it."""

    def __init__(self, urls: list[str], model: str, api_key: str | None, sampling: dict[str, Any],
                 llm_timeout: float, log_dir: str, log_level: str = "INFO", token_capture: str | None = None,
                 down_wait: float | None = None):
        configure_logging(log_dir, "agent-worker", log_level)
        make_full_collections_rare()  # this process will hold thousands of rollouts: no heap-wide pause every turn
        self._client_options = {"timeout": llm_timeout, "sampling": sampling, "token_capture": token_capture}
        self._down_wait = down_wait
        self.urls: list[str] = []
        self.clients: dict[str, ChatClient] = {}
        self.router: Router | None = None
        self._engines_ready = asyncio.Event()
        if urls:
            self._connect(urls, model, api_key)
        self.address = worker_address()
        self.emit = worker_emitter()
        # Rollouts handed over in batches (uni_agent.driver.mailbox): finished ones wait here for the driver's collect.
        self._finished: list[Outcome] = []
        self._finished_event = asyncio.Event()
        self._running: dict[tuple[str, int], asyncio.Task] = {}  # rollout key -> its task
        self._closing: set[asyncio.Task] = set()  # finished rollouts' sandboxes, closing (envelope.sandbox_closer)
        self._last_collect = time.monotonic()
        self._watch: asyncio.Task | None = None

    def _connect(self, urls: list[str], model: str, api_key: str | None) -> None:
        if not urls:
            raise ValueError("AgentWorker needs at least one engine URL")
        register_secret(api_key)
        self.urls = list(urls)
        # With several replicas a dead one is not waited for: its rollouts move on (Router). One replica is waited for
        # up to `down_wait` seconds (its engine restarting, uni_agent.engines.server), and so are all of them.
        down_wait = self._down_wait
        self.clients = {url: ChatClient(url, model, api_key, retry_unreachable=len(urls) == 1,
                                        down_wait=down_wait if len(urls) == 1 else None, **self._client_options)
                        for url in urls}
        self.router = Router(self.clients, give_up_after=down_wait or self._client_options["timeout"])
        self._engines_ready.set()

    async def set_engines(self, urls: list[str], model: str, api_key: str | None) -> None:
        """The engines are ready: rollouts waiting for them begin (uni_agent.driver.pool, once the engines started).
        A second call changes nothing: a worker started with its engines is told again by a pool that raced it."""
        if not self._engines_ready.is_set():
            self._connect(urls, model, api_key)

    async def run_rollout(self, spec: RolloutSpec) -> RolloutResult:
        use_pidfd_child_watcher()
        sandbox_closer.set(self._close_later)  # this rollout's task only: its result returns before the close ends
        strategy = strategy_for(spec.agent)
        open_sandbox = start_sandbox
        if not self._engines_ready.is_set():
            open_sandbox = await self._sandbox_while_engines_start(strategy, spec)
        assert self.router is not None
        session = self.router.session()
        try:
            # the episode imports no grading: a reward graded in the agent's own sandbox comes in through this hook
            result = await run_episode(strategy, spec, session, emit=self.emit, worker=self.address,
                                       open_sandbox=open_sandbox, grade_in_sandbox=grade_in_sandbox)
        finally:
            session.close()
        if spec.agent.log_dir:
            _save_trajectory(spec.agent.log_dir, result)
        return result

    async def _sandbox_while_engines_start(self, strategy: AgentStrategy, spec: RolloutSpec) -> SandboxOpener:
        """Starts the rollout's sandbox now and returns, once the engines are ready, the opener the episode awaits it
        through (its sandbox_start_s is then what was left of the start: the wait the rollout saw)."""
        early = asyncio.ensure_future(_start_logged(strategy, spec))
        try:
            await self._engines_ready.wait()
        except BaseException:  # cancelled (the run ends before its engines started): the sandbox goes too
            if (started := await started_or_stopped(early)) is not None:
                await started.close()
            raise

        async def started_early(agent: Any, name: str) -> Sandbox:
            return await early
        return started_early

    async def start_rollouts(self, batch: Batch) -> int:
        """Start each rollout of the batch (RolloutSpecs) as a task on this worker's loop and return at once;
        `collect` returns the results."""
        specs: list[RolloutSpec] = batch.items
        self._last_collect = time.monotonic()
        if self._watch is None:
            self._watch = asyncio.ensure_future(self._cancel_orphans())
        for spec in specs:
            task = asyncio.ensure_future(self._run_to_collect(spec))
            self._running[spec.key] = task
            task.add_done_callback(lambda t, key=spec.key: self._running.pop(key, None) if self._running.get(key)
                                   is t else None)
        return len(specs)

    async def _run_to_collect(self, spec: RolloutSpec) -> None:
        done: Outcome
        try:
            done = Finished(spec.key, await self.run_rollout(spec))
        except Exception as exc:  # reaches the driver as this rollout's failed actor call
            done = Raised(spec.key, f"{type(exc).__name__}: {exc}")
        self.emit.flush()  # its turn events reach the scheduler before the driver's next event for it
        self._finished.append(done)
        self._finished_event.set()

    def _close_later(self, sandbox: Sandbox) -> None:
        task = asyncio.ensure_future(self._close(sandbox))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    @staticmethod
    async def _close(sandbox: Sandbox) -> None:
        try:
            await sandbox.close()
        except Exception as exc:  # the result is recorded already; what is left is the log's
            log.warning("sandbox_close_failed", sandbox=getattr(sandbox, "name", "?"),
                        error=f"{type(exc).__name__}: {exc}")

    async def _closes_done(self, timeout: float | None = None) -> None:
        if self._closing:
            await asyncio.wait(list(self._closing), timeout=timeout)

    async def _cancel_orphans(self) -> None:
        """A driver that died leaves its rollouts running here (Dask drops the actor, not its tasks): when no one has
        collected for ORPHAN_AFTER_S, they are cancelled, which closes their sandboxes. A live driver collects every
        few seconds; a resumed driver runs them again."""
        while True:
            await asyncio.sleep(ORPHAN_AFTER_S / 4)
            if self._running and time.monotonic() - self._last_collect > ORPHAN_AFTER_S:
                log.warning("driver_gone", cancelled=len(self._running), seconds=ORPHAN_AFTER_S)
                for task in list(self._running.values()):
                    task.cancel()
                self._finished.clear()

    async def collect(self, wait: float) -> Batch:
        """The rollouts finished since the last call (a Batch of Outcomes); waits up to `wait` seconds for one when
        there is none."""
        self._last_collect = time.monotonic()
        if not self._finished:
            self._finished_event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._finished_event.wait(), wait)
        finished, self._finished = self._finished, []
        return Batch(finished)

    async def cancel_rollouts(self, keys: list[tuple[str, int]]) -> int:
        """Cancel those of these rollouts that run here (their sandboxes close first); returns how many did."""
        tasks = [self._running[k] for k in ((str(a), int(b)) for a, b in keys) if k in self._running]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
            await self._closes_done()  # theirs among them
        return len(tasks)

    async def pause_replica(self, url: str, drain_timeout: float) -> int:
        """No new model calls to this replica (its weights are about to switch); waits up to drain_timeout s for
        those in flight and returns how many still run (uni_agent.episode.replica_versions)."""
        return await self._router().versions.pause(url, drain_timeout)

    async def resume_replica(self, url: str, version: int, model: str | None = None) -> None:
        """The replica serves `version` (under the served name `model`, when given): calls go on."""
        if model:
            self.clients[url].model = model
        self._router().versions.resume(url, version)

    async def replica_load(self) -> dict[str, dict[str, Any]]:
        router = self._router()
        v = router.versions
        return {url: {"rollouts": router.load[url], "calls": v.calls[url], "calls_done": v.answered[url],
                      "paused": v.paused(url), "version": v.version[url]} for url in self.clients}

    def _router(self) -> Router:
        if self.router is None:
            raise RuntimeError("this agent worker has no engines yet (set_engines)")
        return self.router

    async def close(self) -> None:
        # A collect call waiting here is proxied by the scheduler: answered now, it is not still open when the
        # cluster closes this worker (the scheduler would log that as an ERROR at every run's end).
        self._finished_event.set()
        if self._watch is not None:
            self._watch.cancel()
        running = list(self._running.values())
        for task in running:  # rollouts whose driver is gone: their sandboxes close on cancellation
            task.cancel()
        if running:  # and are closed before this returns: the cluster may close this worker's loop right after,
            # and a sandbox process still open then is an "Event loop is closed" traceback (and a leak)
            await asyncio.wait(running, timeout=CLOSE_WAIT_S)
        await self._closes_done(CLOSE_WAIT_S)  # so are the finished rollouts' sandboxes still closing
        for client in self.clients.values():
            await client.aclose()


async def _start_logged(strategy: AgentStrategy, spec: RolloutSpec) -> Sandbox:
    """A sandbox started before the engines were ready; its log line says when and how long the start took (the
    row's sandbox_start_s holds only what the rollout waited of it)."""
    t0 = time.monotonic()
    sandbox = await start_sandbox(strategy.sandbox_config(), sandbox_name(spec))
    log.info("sandbox_started_before_engines", run_id=spec.run_id, instance_id=spec.instance_id,
             rollout=spec.rollout, seconds=round(time.monotonic() - t0, 3))
    return sandbox


class Router:
    """Engine replicas for the rollouts of one agent worker: a new rollout gets the least-loaded live replica and
    keeps it for every turn (the server's prefix cache stays warm). A replica that stops accepting connections is
    skipped for `down_for` seconds and the rollouts on it continue, conversation intact, on another replica."""

    def __init__(self, clients: dict[str, ChatClient], *, down_for: float = 30, give_up_after: float = 600):
        self.clients = clients
        self.load = dict.fromkeys(clients, 0)
        self.down_until: dict[str, float] = {}
        self.down_for, self.give_up_after = down_for, give_up_after
        self.failovers = 0
        self.versions = ReplicaVersions(list(clients))  # the policy version each replica serves (uni_agent.online)

    def pick(self) -> str:
        """The least-loaded replica not marked down (and not switching weights, when one is not); when all are down,
        the one whose mark ends first."""
        now = time.monotonic()
        live = [u for u in self.clients if self.down_until.get(u, 0) <= now]
        live = [u for u in live if not self.versions.paused(u)] or live
        if live:
            return min(live, key=self.load.__getitem__)
        return min(self.clients, key=self.down_until.__getitem__)

    def mark_down(self, url: str) -> None:
        self.down_until[url] = time.monotonic() + self.down_for

    def session(self) -> RolloutSession:
        return RolloutSession(self)


class RolloutSession:
    """What the agent loop talks to: `chat` on the rollout's replica, moving to another when that one is down."""

    def __init__(self, router: Router):
        self.router = router
        self.url = router.pick()
        router.load[self.url] += 1

    @property
    def model(self) -> str:
        """The served model's name (every replica serves the same model)."""
        return self.router.clients[self.url].model

    def _move(self, url: str) -> None:
        self.router.load[self.url] -= 1
        self.router.load[url] += 1
        self.url = url

    async def chat(self, *args: Any, **kwargs: Any) -> ChatReply:
        deadline = time.monotonic() + self.router.give_up_after
        versions = self.router.versions
        while True:
            await versions.wait_open(self.url)  # its replica is switching weights: wait for it (sticky)
            called, call = self.url, versions.begin(self.url)
            try:
                reply = await self.router.clients[called].chat(*args, **kwargs)
            except LLMError as exc:
                if versions.switched(called, call):
                    continue  # cut off by a switch of weights: made again on the new ones
                if not isinstance(exc, EndpointDownError) or len(self.router.clients) == 1:
                    raise
                if time.monotonic() > deadline:
                    raise LLMError(f"every engine replica is down ({', '.join(self.router.clients)}); "
                                   f"last: {exc}") from exc
                self.router.mark_down(self.url)
                previous, url = self.url, self.router.pick()
                wait = self.router.down_until.get(url, 0) - time.monotonic()
                if wait > 0:  # every replica is down: wait for the first mark to end (a restart may bring it back)
                    await asyncio.sleep(wait)
                self._move(url)
                if url != previous:
                    self.router.failovers += 1
                    log.warning("replica_failover", url_from=previous, url_to=url, error=str(exc))
                continue
            finally:
                versions.end(called)
            if versions.switched(called, call):
                continue  # answered while its replica switched weights: which weights sampled it is unknown
            if reply.tokens is not None:
                reply.tokens.version = call.version
            return reply

    def close(self) -> None:
        self.router.load[self.url] -= 1


class _PidfdChildWatcher(asyncio.AbstractChildWatcher):
    """Python 3.11 waits for every asyncio subprocess in a thread of its own (ThreadedChildWatcher): a thread start
    per sandbox command, and one more thread contending for the GIL while it runs. Python 3.12 watches a pidfd on the
    event loop instead; this does the same on 3.11, on whichever loop started the process (a worker runs the agents'
    loop and, in threads, each verification's own loop)."""

    def add_child_handler(self, pid: int, callback: Any, *args: Any) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop._add_reader(pidfd, self._exited, loop, pid, pidfd, callback, args)  # type: ignore[attr-defined]

    @staticmethod
    def _exited(loop: Any, pid: int, pidfd: int, callback: Any, args: tuple[Any, ...]) -> None:
        loop._remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
            returncode = os.waitstatus_to_exitcode(status)
        except ChildProcessError:  # reaped elsewhere
            returncode = 255
        callback(pid, returncode, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return False

    def attach_loop(self, loop: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def __enter__(self) -> _PidfdChildWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


_watcher_installed = False


def use_pidfd_child_watcher() -> None:
    """On Python 3.11 and a kernel with pidfds, wait for subprocesses with a pidfd on the event loop (see above)."""
    global _watcher_installed
    if _watcher_installed or sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return
    _watcher_installed = True
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an old kernel, or a sandbox (gVisor) without pidfd_open: keep the threaded watcher
        return
    asyncio.set_child_watcher(_PidfdChildWatcher())


def _save_trajectory(log_dir: str, result: RolloutResult) -> None:
    # One readable file per rollout, named by instance and rollout index (not by an opaque run uuid).
    path = Path(log_dir).expanduser() / result.run_id / f"{result.instance_id}__r{result.rollout}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    row = {**result.row(), "messages": result.messages}
    path.write_text(json.dumps(row, indent=1, ensure_ascii=False))
