"""A Dask actor that owns one LLM server subprocess: start it, wait until it answers, publish its URL, restart it on
the same port when it crashes (bounded), restart it on request (new weights), stop it.

Dask worker processes are daemonic and cannot fork multiprocessing children, so the server is a plain subprocess.
It is started from the worker's event loop thread (an async method), which lives as long as the worker, and gets
PR_SET_PDEATHSIG so that it dies with the worker instead of leaking.

The port is chosen once, at the first start: every restart binds the same one, so the URL the agent workers hold
stays valid and their calls go on where they were (a call made while it is down waits for it, see
uni_agent.llm.client). A crash (the process exits while no stop or restart was asked for) is logged with its exit
code and the tail of the server's log, then the server is started again, at most `max_restarts` times within any
`restart_window` seconds; past that the actor's state is `failed` with a message saying why, which the driver's
engine watch (uni_agent.engines.Engines.guard) turns into the end of the run.

`api_key`: the run's secret (uni_agent.engines.new_api_key), given to the server in its environment (API_KEY_ENV,
the variable the engine reads for its --api-key) and sent by the actor's own health and metrics calls. Without one
(a server driven directly, as some tests and benches do) the server answers anyone who can reach its port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx
import structlog

from ..redact import register_secret
from .process import free_port, kill_group, launch, listener_uid, terminate, wait_until_bindable, worker_host

log = structlog.get_logger("uni_agent.engines")
STATES = ("new", "serving", "restarting", "failed", "stopped")


class EngineRestartError(RuntimeError):
    """A requested restart failed; the message says what serves now (the previous server, or nothing)."""


class ServerActor:
    """Subclasses give `command(host, port)` and, to restart on another model, `swap_model(path)`; the actor handles
    the process, its health and its restarts. `BUSY_METRIC` is the Prometheus gauge of requests in flight at
    /metrics (for `restart(drain_timeout=...)`); `PREFLIGHT` says whether a new model may first be loaded beside the
    serving one (False where two copies do not fit, e.g. vLLM on its GPUs)."""

    BUSY_METRIC: str | None = None
    PREFLIGHT = True
    API_KEY_ENV: str | None = None  # the environment variable the server reads its API key from
    # What the server gets from the kernel when its worker dies (PR_SET_PDEATHSIG). SIGTERM lets a server that has
    # children of its own stop them; a server that may hang in its graceful exit should get SIGKILL, since nothing
    # is left to send it one later (its clients would wait on its open connections).
    DEATH_SIGNAL = signal.SIGTERM

    def __init__(self, name: str, log_path: str, env: dict[str, str] | None = None, *,
                 restart_on_crash: bool = True, max_restarts: int = 3, restart_window: float = 3600.0,
                 api_key: str | None = None):
        self.name = name
        self.log_path = log_path
        self.env = env or {}
        self._api_key = api_key
        register_secret(api_key)  # this worker's logs never show it either
        self.url: str | None = None
        self.state = "new"
        self.restart_on_crash, self.max_restarts, self.restart_window = restart_on_crash, max_restarts, restart_window
        self.restarts = 0  # after crashes
        self.crashes: list[dict[str, Any]] = []  # exit code, log tail, and how long the server was down
        self.failure: str | None = None  # why the state is `failed`
        self._restart_times: deque[float] = deque()
        self._host: str | None = None
        self._port: int | None = None
        self._timeout = 300.0
        self._proc: asyncio.subprocess.Process | None = None
        self._watch: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None  # made on the worker's loop: one start/restart/stop at a time

    def command(self, host: str, port: int) -> list[str]:
        raise NotImplementedError

    def swap_model(self, path: str) -> str:
        """Serve `path` from the next start on; returns the model path served until now."""
        raise NotImplementedError(f"{type(self).__name__} cannot change its model")

    def _guard(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def start(self, timeout: float) -> str:
        """Start the server and wait until it answers; returns its URL (the same one for every later restart)."""
        if not structlog.is_configured():  # the worker's own logs (an agent worker configures them too)
            from ..logs import configure_logging

            configure_logging(Path(self.log_path).parent, "engine-actor")
        self._timeout = timeout
        async with self._guard():
            self._proc = await self._launch(self._port_to_use())
            await self._wait_ready(self._proc, timeout)
            self.state, self.failure = "serving", None
            self._watch_current()
        return str(self.url)

    def _port_to_use(self) -> int:
        if self._port is None:
            self._host = worker_host()
            self._port = free_port(self._host)
            self.url = f"http://{self._host}:{self._port}/v1"
        return self._port

    def child_env(self) -> dict[str, str]:
        """What the server's environment gets besides the worker's: `env`, and the API key where there is one."""
        if self._api_key is None or self.API_KEY_ENV is None:
            return dict(self.env)
        return {**self.env, self.API_KEY_ENV: self._api_key}

    def _http(self, timeout: float = 5) -> httpx.AsyncClient:
        """A client for the actor's own calls to its server (readiness, metrics), with the key."""
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        return httpx.AsyncClient(timeout=timeout, headers=headers)

    async def _launch(self, port: int) -> asyncio.subprocess.Process:
        return await launch(self.command(str(self._host), port), self.log_path, self.child_env(), self.DEATH_SIGNAL)

    async def _wait_ready(self, proc: asyncio.subprocess.Process, timeout: float, port: int | None = None) -> None:
        url = f"http://{self._host}:{port or self._port}/v1"
        deadline = time.monotonic() + timeout
        async with self._http() as http:
            while time.monotonic() < deadline:
                if proc.returncode is not None:
                    raise RuntimeError(f"{self.name} exited with {proc.returncode}; see {self.log_path}:\n"
                                       + self.log_tail())
                self._check_listener(port or self._port, proc)  # before the key goes to whoever answers
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get(f"{url}/models")).status_code == 200:
                        return
                await asyncio.sleep(0.5)
        await terminate(proc)
        raise TimeoutError(f"{self.name} did not answer at {url} within {timeout:g}s; see {self.log_path}")

    def _check_listener(self, port: int | None, proc: asyncio.subprocess.Process) -> None:
        """Whoever listens on the port must be us: another user who bound it first would get every request of the
        run, the API key in each."""
        owner = listener_uid(port) if port is not None else None
        if owner is not None and owner != os.geteuid():
            kill_group(proc.pid)
            raise RuntimeError(f"{self.name}: port {port} is held by another user (uid {owner}), not by this "
                               "server; refusing to send it the run's requests")

    def _watch_current(self) -> None:
        proc = self._proc
        self._watch = asyncio.ensure_future(self._watch_for_crash(proc)) if proc is not None else None

    async def _watch_for_crash(self, proc: asyncio.subprocess.Process) -> None:
        code = await proc.wait()
        if proc is not self._proc or self.state != "serving":  # a stop or a requested restart ended it
            return
        down_since = time.monotonic()
        kill_group(proc.pid)  # what the server started (vLLM's engine processes) goes with it, GPU memory freed
        self.state = "restarting"
        self._record_crash(code)
        async with self._guard():
            while self.state == "restarting":
                if not self._restart_allowed():
                    self._fail(code)
                    return
                self.restarts += 1
                self._restart_times.append(time.monotonic())
                self._note(f"exit code {code}: restart {len(self._restart_times)} of {self.max_restarts} within "
                           f"{self.restart_window:g} s")
                try:
                    await wait_until_bindable(str(self._host), self._port_to_use(), 30)
                    self._proc = await self._launch(self._port_to_use())
                    await self._wait_ready(self._proc, self._timeout)
                except Exception as exc:  # noqa: BLE001 - a failed start is one more crash
                    failed = self._proc
                    code = failed.returncode if failed is not None and failed.returncode is not None else -1
                    log.error("engine_restart_failed", engine=self.name, url=self.url,
                              error=f"{type(exc).__name__}: {exc}"[:2000])
                    self._record_crash(code, f"{type(exc).__name__}: {exc}")
                    continue
                down_s = round(time.monotonic() - down_since, 3)
                self.crashes[-1]["down_s"] = down_s
                self.state = "serving"
                log.warning("engine_restarted", engine=self.name, url=self.url, restart=self.restarts, down_s=down_s)
                _dask_event({"event": "engine_restarted", "engine": self.name, "url": self.url, "down_s": down_s})
                self._watch_current()

    def _record_crash(self, code: int, error: str | None = None) -> None:
        tail = self.log_tail(2000)
        self.crashes.append({"returncode": code, "url": self.url, "t": time.time(), "log_tail": tail,
                             **({"error": error[:2000]} if error else {})})
        log.error("engine_crashed", engine=self.name, url=self.url, returncode=code, log=self.log_path,
                  log_tail=tail[-1000:], restart=self._restart_allowed())
        _dask_event({"event": "engine_crashed", "engine": self.name, "url": self.url, "returncode": code})

    def _restart_allowed(self) -> bool:
        if not self.restart_on_crash:
            return False
        while self._restart_times and time.monotonic() - self._restart_times[0] > self.restart_window:
            self._restart_times.popleft()
        return len(self._restart_times) < self.max_restarts

    def _fail(self, code: int) -> None:
        if self.restart_on_crash:
            why = (f"it crashed {len(self.crashes)} times and was restarted {len(self._restart_times)} times within "
                   f"{self.restart_window:g} s (engine_max_restarts={self.max_restarts})")
        else:
            why = "engine_restart_on_crash is off"
        self.state, self.failure = "failed", (
            f"{self.name} at {self.url} is down for good: {why}; last exit code {code}; see {self.log_path}:\n"
            + self.log_tail(1500))
        self._note(f"exit code {code}: no restart ({why})")
        log.error("engine_failed", engine=self.name, url=self.url, returncode=code, reason=why)
        _dask_event({"event": "engine_failed", "engine": self.name, "url": self.url, "returncode": code})

    async def restart(self, new_model_path: str | None = None, *, timeout: float | None = None,
                      drain_timeout: float = 0.0, preflight: bool | None = None) -> str:
        """Stop the server and start it again on the same port, optionally on another model; returns the URL.

        drain_timeout: first wait up to this long for the requests in flight to end (BUSY_METRIC); calls made while
        it is down wait for it (the client's down-wait) and go on once it answers. With a new model, `preflight`
        (default PREFLIGHT) first loads it on a spare port while the old server keeps serving, so a model that does
        not start leaves the old one untouched; without preflight a failed start brings the old model back. Either
        way a failure is an EngineRestartError saying what serves now."""
        timeout = timeout or self._timeout
        async with self._guard():
            previous = self.swap_model(new_model_path) if new_model_path else None
            if previous is not None and (self.PREFLIGHT if preflight is None else preflight):
                await self._preflight(previous, timeout)
            self.state = "restarting"  # the watch leaves the deliberate exit alone
            if drain_timeout > 0:
                await self._drain(drain_timeout)
            await terminate(self._proc)
            started = time.monotonic()
            try:
                self._proc = await self._launch(self._port_to_use())
                await self._wait_ready(self._proc, timeout)
            except Exception as exc:
                if previous is None:
                    self.state, self.failure = "failed", f"{self.name}: restart failed: {exc}"
                    raise EngineRestartError(f"{self.failure}; nothing serves at {self.url}") from exc
                self.swap_model(previous)
                self._proc = await self._launch(self._port_to_use())
                await self._wait_ready(self._proc, timeout)
                self.state = "serving"
                self._watch_current()
                raise EngineRestartError(f"{self.name}: {new_model_path} did not start ({exc}); {previous} serves "
                                         f"again at {self.url}") from exc
            self.state, self.failure = "serving", None
            self._watch_current()
        log.info("engine_restarted_on_request", engine=self.name, url=self.url, model=new_model_path,
                 down_s=round(time.monotonic() - started, 3))
        return str(self.url)

    async def _preflight(self, previous: str, timeout: float) -> None:
        port = free_port(str(self._host))
        proc = await self._launch(port)
        try:
            await self._wait_ready(proc, timeout, port)
        except Exception as exc:
            self.swap_model(previous)
            raise EngineRestartError(f"{self.name}: the new model did not start ({exc}); {previous} still serves "
                                     f"at {self.url}") from exc
        finally:
            await terminate(proc)

    async def _drain(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and (await self.in_flight() or 0) > 0:
            await asyncio.sleep(0.2)

    async def in_flight(self) -> int | None:
        """Requests the server is working on (its BUSY_METRIC), None when it cannot tell."""
        if self.BUSY_METRIC is None or self.url is None:
            return None
        try:
            async with self._http() as http:
                text = (await http.get(self.url.removesuffix("/v1") + "/metrics")).text
        except httpx.HTTPError:
            return None
        values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(self.BUSY_METRIC)]
        return int(sum(values)) if values else None

    def _note(self, line: str) -> None:
        with contextlib.suppress(OSError), open(self.log_path, "a") as f:
            f.write(f"\n[uni-agent] {line}\n")

    def log_tail(self, chars: int = 3000) -> str:
        with contextlib.suppress(OSError), open(self.log_path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - chars))
            return f.read().decode(errors="replace")
        return ""

    async def alive(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def describe(self) -> dict[str, Any]:
        """What the driver's engine watch reads: state, URL, restarts and crashes (with their log tails)."""
        return {"name": self.name, "url": self.url, "state": self.state, "alive": await self.alive(),
                "pid": self._proc.pid if self._proc is not None else None, "restarts": self.restarts,
                "crashes": self.crashes, "failure": self.failure}

    async def stop(self) -> None:
        self.state = "stopped"
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.cancel()  # no crash-restart begins or goes on now; one under way has made self._proc already
            with contextlib.suppress(asyncio.CancelledError):
                await watch
        async with self._guard():  # a requested restart under way finishes first, then its server stops
            self.state = "stopped"
            proc, self._proc = self._proc, None
            await terminate(proc)


def _dask_event(msg: dict[str, Any]) -> None:
    """The crash on the scheduler's event log too (topic uni-agent-engine), where the worker runs in Dask."""
    with contextlib.suppress(Exception):
        from distributed import get_worker

        get_worker().log_event("uni-agent-engine", msg)
