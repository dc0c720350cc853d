"""The Modal backend: a Modal sandbox per rollout, through the `modal` SDK's async (`.aio`) API.

start: the app is looked up once per process (`App.lookup(create_if_missing=True)`; this first call is also the
credentials check, bounded so that a bad token fails in seconds, not after the SDK's ~57 s of retries) → wait for a
starting slot (at most `max_starting` sandboxes of this process between create and their first answered command) and
for the create rate (`creates_per_second`) → `Sandbox.create` from `Image.from_registry(image)` with the deployment's
lifetime as Modal's `timeout`, so Modal ends the sandbox even if this process dies → start the sandbox supervisor
(supervisor.py) as one long-lived exec whose stdin/stdout carry the session (session.py): every command after that
is a message on that stream, not an exec of its own → upload the task repository when the config names one → a
probe command. All of it within `startup_timeout`.

Errors: transient ones (connection, rate limit, internal, timeouts) become SandboxStartError, which the agent loop's
tenacity retries; the rest (auth, invalid arguments) are SandboxError and fail at once. `close()` terminates the
sandbox on every path, retrying transient failures; if the create call itself was interrupted (cancelled, timed out,
connection lost), the sandbox is found by its unique name and terminated. Modal cannot be reached from the project's
machines: the tests run this module against a fake `modal` module that checks every call against the real SDK's
signatures (tests/test_sandbox_modal.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
import threading
import time
from typing import Any, Literal

import structlog
from pydantic import Field, field_validator
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from .backend import SessionSandbox, Transport
from .base import ImageDeploymentBase, SandboxError, SandboxStartError
from .container import LABEL, lifetime_s, sandbox_name
from .limiter import start_limits
from .repo import archive_tree, prepare_base_repo, resolve_repo
from .session import ImageWithoutPython, reader_from_chunks
from .supervisor_launch import supervisor_shell_argv

log = structlog.get_logger("uni_agent.sandbox")

APP_LOOKUP_TIMEOUT_S = 30.0
"""The first SDK call of the process; with a wrong token or no route to Modal it would otherwise retry ~57 s."""
TERMINATE_TIMEOUT_S = 60.0
TERMINATE_ATTEMPTS = 3
TRANSIENT_ERRORS = ("ConnectionError", "InternalFailure", "InternalError", "ResourceExhaustedError", "TimeoutError",
                    "ServiceError", "ImageBuildError")

_apps: dict[tuple[str, str | None], Any] = {}
_apps_lock = threading.Lock()
_proxy_lock = threading.Lock()


def import_modal() -> Any:
    try:
        import modal
    except ImportError:
        raise SandboxError("the modal deployment needs the modal SDK: pip install 'uni-agent[modal]'") from None
    return modal


def is_transient(modal: Any, exc: BaseException) -> bool:
    classes = tuple(c for n in TRANSIENT_ERRORS if isinstance(c := getattr(modal.exception, n, None), type))
    return isinstance(exc, classes + (OSError, TimeoutError))


def apply_proxy(proxy: str | None) -> None:
    """The SDK reads HTTPS_PROXY when it opens its connection (once per process): set it before the first call."""
    if not proxy:
        return
    if importlib.util.find_spec("python_socks") is None:
        raise SandboxError("a Modal proxy needs python-socks: pip install 'uni-agent[modal]' "
                           "(it brings modal[api-proxy-support])")
    with _proxy_lock:
        current = {os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy")} - {None}
        if current and current != {proxy}:
            raise SandboxError(f"HTTPS_PROXY is already set to {sorted(current)} in this process; Modal takes one "
                               f"proxy per process, not {proxy!r}")
        os.environ["HTTPS_PROXY"] = proxy
        os.environ["https_proxy"] = proxy


async def lookup_app(modal: Any, name: str, environment_name: str | None) -> Any:
    """The app (cached per process). Doubles as the credentials check, with a clear error and a short bound."""
    key = (name, environment_name)
    with _apps_lock:
        if key in _apps:
            return _apps[key]
    try:
        async with asyncio.timeout(APP_LOOKUP_TIMEOUT_S):
            app = await modal.App.lookup.aio(name, create_if_missing=True, environment_name=environment_name)
    except TimeoutError:
        raise SandboxError(
            f"Modal did not answer within {APP_LOOKUP_TIMEOUT_S:g}s: check the token (MODAL_TOKEN_ID / "
            "MODAL_TOKEN_SECRET or ~/.modal.toml), the network and the deployment's `proxy`") from None
    except modal.exception.AuthError as exc:
        raise SandboxError(f"Modal credentials are missing or rejected: set MODAL_TOKEN_ID and MODAL_TOKEN_SECRET "
                           f"(or run `modal token new`). The SDK said: {exc}") from None
    except modal.exception.Error as exc:
        if is_transient(modal, exc):
            raise SandboxStartError(f"Modal app lookup failed: {type(exc).__name__}: {exc}") from exc
        raise SandboxError(f"Modal app lookup failed: {type(exc).__name__}: {exc}") from exc
    with _apps_lock:
        _apps.setdefault(key, app)
    return app


class ModalDeploymentConfig(ImageDeploymentBase):
    """A Modal sandbox (modal SDK, `pip install 'uni-agent[modal]'`), from a registry image."""

    type: Literal["modal"] = "modal"
    app_name: str = "uni-agent"
    """The Modal app the sandboxes belong to (looked up, created if missing)."""
    environment_name: str | None = None
    repo: str | None = None
    """A repository to upload into `workdir` at start (a directory or `bundled:<id>`); None: the image's."""
    workdir: str = "/testbed"
    cpu: float | None = Field(default=None, gt=0)
    memory: int | None = Field(default=None, ge=1)
    """MiB."""
    block_network: bool = True
    """Cut the sandbox off the network (the other backends are offline by default too)."""
    add_python: str | None = None
    """Have Modal add a Python of this version to the image (`Image.from_registry(..., add_python=)`)."""
    max_starting: int = Field(default=32, ge=1)
    """Sandboxes of this process that may be starting (created, not yet answering) at once."""
    creates_per_second: float = Field(default=4.0, gt=0)
    """Sandbox.create calls per second from this process (Modal rate-limits creates per account)."""
    modal_sandbox_kwargs: dict[str, Any] = Field(default_factory=dict)
    """More keyword arguments for `modal.Sandbox.create` (e.g. region, gpu, idle_timeout)."""

    @field_validator("modal_sandbox_kwargs")
    @classmethod
    def _not_ours(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        owned = {"app", "image", "timeout", "workdir", "cpu", "memory", "block_network", "name", "tags"}
        clash = sorted(owned & set(kwargs))
        if clash:
            raise ValueError(f"{clash} are set by their own deployment fields, not modal_sandbox_kwargs")
        return kwargs

    def build(self, env_variables: dict[str, str], name: str = "") -> ModalSandbox:
        return ModalSandbox(self, env_variables, name=name)


class ModalSandbox(SessionSandbox):
    def __init__(self, config: ModalDeploymentConfig, env_variables: dict[str, str] | None = None, name: str = ""):
        if not config.image:
            raise SandboxError("modal deployment needs `image` (a registry image, e.g. python:3.11)")
        super().__init__(config, env_variables, sandbox_name(name))
        self.sandbox_id: str | None = None
        self._modal: Any = None
        self._sandbox: Any = None
        self._supervisor: Any = None  # the long-lived exec that runs the supervisor
        self._pump: asyncio.Task | None = None
        self._create_sent = False  # Sandbox.create was called: a sandbox may exist even if the call never returned

    # -- where it lives ----------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.name} was closed")
        config = self.config
        modal = self._modal = import_modal()
        apply_proxy(config.proxy)
        limits = start_limits(("modal", config.app_name), config.max_starting, config.creates_per_second)
        started = time.monotonic()
        async with limits.cap.slot():
            try:
                async with asyncio.timeout(config.startup_timeout):
                    app = await lookup_app(modal, config.app_name, config.environment_name)
                    assert limits.rate is not None
                    await limits.rate.wait()
                    await self._create(modal, app)
                    await self._start_session()
            except TimeoutError:
                raise SandboxStartError(f"Modal sandbox {self.name} did not start within "
                                        f"startup_timeout={config.startup_timeout:g}s") from None
            except modal.exception.Error as exc:
                kind = SandboxStartError if is_transient(modal, exc) else SandboxError
                raise kind(f"Modal sandbox {self.name} failed to start: {type(exc).__name__}: {exc}") from exc
        log.debug("modal_sandbox_started", name=self.name, sandbox_id=self.sandbox_id,
                  seconds=round(time.monotonic() - started, 3))

    async def _start_session(self) -> None:
        try:
            await super().start()
        except (SandboxStartError, ImageWithoutPython):  # the latter: the image will not change
            raise
        except SandboxError as exc:  # the stream to a fresh sandbox broke while setting up: start over
            raise SandboxStartError(str(exc)) from exc

    async def _create(self, modal: Any, app: Any) -> None:
        config = self.config
        image_kwargs = {"add_python": config.add_python} if config.add_python else {}
        image = modal.Image.from_registry(config.image, **image_kwargs)
        kwargs: dict[str, Any] = dict(config.modal_sandbox_kwargs)
        if config.cpu is not None:
            kwargs["cpu"] = config.cpu
        if config.memory is not None:
            kwargs["memory"] = config.memory
        self._create_sent = True
        self._sandbox = await modal.Sandbox.create.aio(
            "sleep", "infinity",
            app=app, name=self.name, tags={LABEL: "1"}, image=image,
            timeout=math.ceil(config.deployment_timeout), workdir=config.workdir,
            block_network=config.block_network, **kwargs,
        )
        self.sandbox_id = getattr(self._sandbox, "object_id", None)

    async def _launch(self) -> Transport:
        lifetime = lifetime_s(self.config.deployment_timeout)
        proc = self._supervisor = await self._sandbox.exec.aio(
            *supervisor_shell_argv(self.state_dir, lifetime), timeout=lifetime, text=False)
        reader, self._pump = reader_from_chunks(proc.stdout)
        return Transport(reader, self._write, self._describe_end)

    async def _provision(self) -> None:
        if self.config.repo is None:
            return
        base = await asyncio.to_thread(prepare_base_repo, resolve_repo(self.config.repo))
        data = await asyncio.to_thread(archive_tree, base)
        result = await self.exec(f"tar -C {self.workdir} -xf -", self.config.startup_timeout, stdin=data)
        if result.exit_code != 0:
            raise SandboxStartError(f"could not upload the repository: {result.output[-2000:]}")

    async def _write(self, data: bytes | None) -> None:
        proc = self._supervisor
        if proc is None:
            raise BrokenPipeError("the supervisor is not running")
        try:
            if data is None:
                proc.stdin.write_eof()
            else:
                proc.stdin.write(data)
            await proc.stdin.drain.aio()
        except self._modal.exception.Error as exc:  # the sandbox or the connection to it failed
            raise ConnectionResetError(f"Modal: {type(exc).__name__}: {exc}") from exc

    async def _describe_end(self) -> str:
        proc = self._supervisor
        if proc is None:
            return "not started"
        try:
            async with asyncio.timeout(5):
                code = await proc.wait.aio()
                err = await proc.stderr.read.aio()
        except Exception as exc:  # noqa: BLE001 - only for the message
            return f"the supervisor's status is unknown ({type(exc).__name__}: {exc})"
        tail = (err.decode("utf-8", "replace") if isinstance(err, bytes) else str(err)).strip()[-2000:]
        return f"exit status {code}; stderr: {tail}" if tail else f"exit status {code}"

    async def _teardown(self) -> None:
        """Terminate the sandbox on every path; if the create call never returned, find it by name."""
        pump, self._pump = self._pump, None
        if pump is not None:
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump
        sandbox, self._sandbox = self._sandbox, None
        create_sent, self._create_sent = self._create_sent, False
        supervisor, self._supervisor = self._supervisor, None
        if create_sent:
            await self._terminate(sandbox)
        if supervisor is not None:  # ended with the sandbox: collect its exit so nothing of it is left pending
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await supervisor.wait.aio()

    async def _terminate(self, sandbox: Any) -> None:
        modal = self._modal
        retrying = AsyncRetrying(
            retry=retry_if_exception(lambda exc: is_transient(modal, exc)),
            stop=stop_after_attempt(TERMINATE_ATTEMPTS), wait=wait_exponential_jitter(multiplier=0.5, max=5),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    async with asyncio.timeout(TERMINATE_TIMEOUT_S):
                        if sandbox is None:  # the create call never returned: find it by its unique name
                            sandbox = await self._find_by_name(modal)
                            if sandbox is None:
                                return
                        await sandbox.terminate.aio()
        except Exception as exc:  # logged loudly: a leaked sandbox counts against the account until its timeout
            log.error("modal_sandbox_not_terminated", name=self.name, sandbox_id=self.sandbox_id,
                      error=f"{type(exc).__name__}: {exc}")

    async def _find_by_name(self, modal: Any) -> Any:
        try:
            return await modal.Sandbox.from_name.aio(self.config.app_name, self.name,
                                                     environment_name=self.config.environment_name)
        except modal.exception.NotFoundError:
            return None
