"""The Modal backend against a FAKE `modal` module: Modal's cloud cannot be reached from the project's machines.

The fake follows the real SDK (modal==1.6.4, installed with the test extra): every call is bound against the real
function's signature (a wrong or misspelt argument is a TypeError, as with the SDK), only the async `.aio` forms
exist where the SDK has them (calling the blocking form from async code fails the test), and the exceptions are the
SDK's own classes. A fake sandbox runs its commands for real, in bubblewrap, on the host's filesystem (read-only) with
its own /testbed, /tmp and /run: the in-sandbox shell protocol, the repository upload and the grading run as they
would on Modal. "Modal ended it" is emulated by killing every process carrying the sandbox's environment marker.

What is not covered, and how a user with a Modal account checks it: the real service (its latency, errors, image
pulls, the exact exit status of an exec past its timeout). Run `examples/agent_interaction/parallel_verify_swe.py
--agent-config-path examples/agent_interaction/agent_config_modal.yaml --patch gold` on a few rows preprocessed with
`--deployment modal`, with MODAL_TOKEN_ID / MODAL_TOKEN_SECRET set: every gold patch should resolve.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import os
import re
import shutil
import sys
import time
import types
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from uni_agent.episode.agent_loop import start_sandbox
from uni_agent.config import AgentConfig, AgentConfigs, ConfigError
from uni_agent.sandbox import SandboxError, SandboxStartError, read_file, write_file
from uni_agent.sandbox import modal as modal_backend
from uni_agent.sandbox.limiter import RateLimiter, StartingCap
from uni_agent.sandbox.modal import ModalDeploymentConfig
from uni_agent.sandbox.bwrap import _python_dirs
from uni_agent.tasks.swe_form import BUNDLED_DIR, load_instance
from uni_agent.grading import verify_patch

try:
    import modal as real_modal
    from modal.container_process import ContainerProcess as RealProcess
    from modal.io_streams import StreamReader as RealReader
    from modal.io_streams import StreamWriter as RealWriter
except ImportError as exc:  # the test extra installs it: its absence is a failure, not a skip
    raise ImportError("the modal SDK is not installed (pip install -e '.[test]')") from exc

T = TypeVar("T")
MODAL_CONFIG = Path(__file__).resolve().parent.parent / "examples" / "agent_interaction" / "agent_config_modal.yaml"
ERR = real_modal.exception


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


# -- the fake SDK ---------------------------------------------------------------------------------------------------


def _signature(real: Any, drop_self: bool) -> inspect.Signature:
    sig = inspect.signature(real)
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:] if drop_self else params)


class Aio:
    """A fake SDK callable: the blocking form is refused, `.aio` checks the arguments against the real signature."""

    def __init__(self, real: Any, impl: Callable[..., Awaitable[Any]], drop_self: bool = True):
        assert hasattr(real, "aio"), f"{real} has no .aio form in the real SDK"
        self.signature = _signature(real, drop_self)
        self.impl = impl

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a blocking modal call from async code: use the .aio form")

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        self.signature.bind(*args, **kwargs)  # TypeError on a wrong argument, as the SDK would raise
        return await self.impl(*args, **kwargs)


def _checked(real: Any, impl: Callable[..., Any], drop_self: bool = True) -> Callable[..., Any]:
    """A plain (non-.aio) SDK function, checked against the real signature."""
    assert not hasattr(real, "aio"), f"{real} has an .aio form in the real SDK; the fake should use Aio"
    sig = _signature(real, drop_self)

    def call(*args: Any, **kwargs: Any) -> Any:
        sig.bind(*args, **kwargs)
        return impl(*args, **kwargs)

    return call


class FakeReader:
    def __init__(self, stream: asyncio.StreamReader, text: bool, on_data: Callable[[], None] = lambda: None):
        self._stream, self._text, self._on_data = stream, text, on_data
        self.read = Aio(RealReader.read, self._read_all)

    async def _read_all(self) -> Any:
        data = await self._stream.read()
        return data.decode() if self._text else data

    async def __aiter__(self):
        while chunk := await self._stream.read(65536):
            self._on_data()  # a sandbox that sent output has answered (the supervisor's exec never ends)
            yield chunk.decode() if self._text else chunk


class FakeWriter:
    def __init__(self, stream: asyncio.StreamWriter | None):
        self._stream, self._buffer, self._eof = stream, bytearray(), False
        self.write = _checked(RealWriter.write, lambda data: self._buffer.extend(
            data.encode() if isinstance(data, str) else data))
        self.write_eof = _checked(RealWriter.write_eof, lambda: setattr(self, "_eof", True))
        self.drain = Aio(RealWriter.drain, self._drain)

    async def _drain(self) -> None:
        if self._stream is None:
            return
        data, self._buffer = bytes(self._buffer), bytearray()
        try:
            if data:
                self._stream.write(data)
                await self._stream.drain()
            if self._eof:
                self._stream.close()
        except (BrokenPipeError, ConnectionResetError):
            pass


class FakeProcess:
    def __init__(self, sandbox: FakeSandbox, proc: asyncio.subprocess.Process, text: bool, timeout: int | None):
        self._sandbox, self._proc, self._timeout = sandbox, proc, timeout
        self._returncode: int | None = None
        self.stdout = FakeReader(proc.stdout, text, sandbox.answered)  # type: ignore[arg-type]
        self.stderr = FakeReader(proc.stderr, text)  # type: ignore[arg-type]
        self.stdin = FakeWriter(proc.stdin)
        self.wait = Aio(RealProcess.wait, self._wait)

    @property
    def returncode(self) -> int:
        if self._returncode is None:
            raise ERR.InvalidError("You must call wait() before accessing the returncode.")
        return self._returncode

    async def _wait(self) -> int:
        try:
            async with asyncio.timeout(self._timeout):
                code = await self._proc.wait()
        except TimeoutError:  # Modal kills an exec at its timeout; the SDK's wait() then answers -1
            self._sandbox.kill_processes(self._proc.pid)
            await self._proc.wait()
            code = -1
        self._returncode = code
        self._sandbox.answered()
        return code


class FakeSandbox:
    def __init__(self, cloud: FakeCloud, app: FakeApp, name: str | None, kwargs: dict[str, Any]):
        self.cloud, self.app, self.name, self.kwargs = cloud, app, name, kwargs
        self.object_id = f"sb-{uuid.uuid4().hex[:22]}"
        self.root = cloud.root / self.object_id
        for sub in ("tmp", "run", "home", "workdir"):
            (self.root / sub).mkdir(parents=True)
        self.terminated = False  # terminate() was called (what the leak check looks at)
        self.ended = False  # the sandbox stopped by itself (its timeout); exec fails, terminate() is still due
        self.is_answered = False
        self.procs: set[asyncio.subprocess.Process] = set()
        self.exec = Aio(real_modal.Sandbox.exec, self._exec)
        self.terminate = Aio(real_modal.Sandbox.terminate, self._terminate)

    def answered(self) -> None:
        if not self.is_answered:
            self.is_answered = True
            self.cloud.starting -= 1

    def marker(self) -> str:
        return f"{self.cloud.marker}:{self.object_id}"

    def _bwrap(self, args: tuple[str, ...]) -> list[str]:
        workdir = self.kwargs.get("workdir") or "/"
        argv = ["bwrap", "--die-with-parent", "--clearenv", "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        if self.kwargs.get("block_network"):
            argv.append("--unshare-net")
        for link in ("bin", "lib", "lib32", "lib64", "sbin"):
            if os.path.islink(f"/{link}"):
                argv += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
            elif os.path.isdir(f"/{link}"):
                argv += ["--ro-bind", f"/{link}", f"/{link}"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--bind", str(self.root / "tmp"), "/tmp",
                 "--bind", str(self.root / "run"), "/run", "--bind", str(self.root / "home"), "/root"]
        for python_dir in _python_dirs():
            argv += ["--ro-bind", python_dir, python_dir]
        argv += ["--bind", str(self.root / "workdir"), workdir, "--chdir", workdir,
                 "--setenv", "PATH", f"{sys.prefix}/bin:/usr/local/bin:/usr/bin:/bin",
                 "--setenv", "HOME", "/root", "--setenv", "FAKE_MODAL_SANDBOX", self.marker()]
        return [*argv, "--", *args]

    async def _exec(self, *args: str, timeout: int | None = None, text: bool = True, **_: Any) -> FakeProcess:
        if self.terminated or self.ended:
            raise ERR.SandboxTerminatedError()
        await self.cloud.fail("exec")
        proc = await asyncio.create_subprocess_exec(
            *self._bwrap(args), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE)
        self.procs.add(proc)
        self.cloud.exec_argvs.append(args)
        return FakeProcess(self, proc, text, timeout)

    async def _terminate(self, *, wait: bool = False) -> int | None:
        await self.cloud.fail("terminate")
        self.terminate_now()
        return None

    def terminate_now(self) -> None:
        if self.terminated:
            return
        self.terminated = True
        if not self.is_answered:
            self.answered()
        self.kill_processes()
        shutil.rmtree(self.root, ignore_errors=True)

    def kill_processes(self, *only: int) -> None:
        for pid in [*only, *processes_marked(self.marker())]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)


class FakeApp:
    def __init__(self, name: str, environment_name: str | None):
        self.name, self.environment_name = name, environment_name
        self.app_id = f"ap-{uuid.uuid4().hex[:22]}"


class FakeImage:
    def __init__(self, tag: str, kwargs: dict[str, Any]):
        self.tag, self.kwargs = tag, kwargs


class FakeCloud:
    """The fake Modal service and the `modal` module that talks to it."""

    def __init__(self, root: Path):
        self.root = root
        self.marker = f"fake-modal-{uuid.uuid4().hex[:8]}"
        self.sandboxes: list[FakeSandbox] = []
        self.create_times: list[float] = []
        self.exec_argvs: list[tuple[str, ...]] = []
        self.lookups: list[dict[str, Any]] = []
        self.images: list[FakeImage] = []
        self.starting = 0
        self.max_starting = 0
        self.create_latency = 0.0
        self.create_gate: asyncio.Event | None = None  # when set, create waits for it (after registering)
        self.failures: dict[str, list[BaseException]] = {"create": [], "exec": [], "terminate": []}
        self.lose_create_responses = 0  # create makes the sandbox, then the answer is "lost" (ConnectionError)
        self.auth = "ok"  # ok | missing | hang
        self.module = self._module()

    async def fail(self, what: str) -> None:
        if self.failures[what]:
            raise self.failures[what].pop(0)

    def live(self) -> list[FakeSandbox]:
        return [s for s in self.sandboxes if not s.terminated]

    # -- SDK entry points --------------------------------------------------------------------------------------
    async def app_lookup(self, name: str, *, client: Any = None, environment_name: str | None = None,
                         create_if_missing: bool = False) -> FakeApp:
        self.lookups.append({"name": name, "environment_name": environment_name,
                             "create_if_missing": create_if_missing})
        if self.auth == "missing":
            raise ERR.AuthError("Token missing. Could not authenticate client.")
        if self.auth == "hang":  # a wrong token with no route to Modal: the SDK retries for about a minute
            await asyncio.Event().wait()
        return FakeApp(name, environment_name)

    def from_registry(self, tag: str, secret: Any = None, **kwargs: Any) -> FakeImage:
        image = FakeImage(tag, kwargs)
        self.images.append(image)
        return image

    async def create(self, *args: str, app: Any = None, name: str | None = None, image: Any = None,
                     **kwargs: Any) -> FakeSandbox:
        self.create_times.append(time.monotonic())
        assert isinstance(app, FakeApp), "Sandbox.create needs an app from App.lookup"
        assert isinstance(image, FakeImage)
        assert name is None or (len(name) <= 64 and re.fullmatch(r"[a-zA-Z0-9-_.]+", name)), name
        assert isinstance(kwargs.get("timeout", 300), int)
        await self.fail("create")
        sandbox = FakeSandbox(self, app, name, {"args": args, "image": image, **kwargs})
        self.sandboxes.append(sandbox)
        self.starting += 1
        self.max_starting = max(self.max_starting, self.starting)
        if self.create_gate is not None:
            await self.create_gate.wait()
        if self.create_latency:
            await asyncio.sleep(self.create_latency)  # the service's latency, not a synchronisation
        if self.lose_create_responses:
            self.lose_create_responses -= 1
            raise ERR.ConnectionError("Could not connect to the Modal server.")
        return sandbox

    async def from_name(self, app_name: str, name: str, *, environment_name: str | None = None,
                        include_terminated: bool = False, client: Any = None) -> FakeSandbox:
        for sandbox in self.sandboxes:
            if sandbox.app.name == app_name and sandbox.name == name and (include_terminated
                                                                          or not sandbox.terminated):
                return sandbox
        raise ERR.NotFoundError(f"Sandbox {name!r} not found in app {app_name!r}")

    def _module(self) -> types.ModuleType:
        module = types.ModuleType("modal")
        module.exception = ERR  # the SDK's own exception classes
        module.App = types.SimpleNamespace(lookup=Aio(real_modal.App.lookup, self.app_lookup, drop_self=False))
        module.Image = types.SimpleNamespace(
            from_registry=_checked(real_modal.Image.from_registry, self.from_registry, drop_self=False))
        module.Sandbox = types.SimpleNamespace(
            create=Aio(real_modal.Sandbox.create, self.create, drop_self=False),
            from_name=Aio(real_modal.Sandbox.from_name, self.from_name, drop_self=False))
        return module


def processes_marked(marker: str) -> list[int]:
    pids = []
    needle = f"FAKE_MODAL_SANDBOX={marker}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.fixture
def cloud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The fake, injected as `modal`; afterwards no sandbox may be left running, nor any of their processes."""
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeCloud(tmp_path / "modal")
    monkeypatch.setitem(sys.modules, "modal", fake.module)
    monkeypatch.setattr(modal_backend, "_apps", {})
    yield fake
    leaked = fake.live()
    for sandbox in leaked:
        sandbox.terminate_now()
    assert not leaked, f"sandboxes left running: {[s.name for s in leaked]}"
    assert processes_marked(fake.marker) == [], "processes of fake sandboxes still running"


def deployment(**overrides: Any) -> ModalDeploymentConfig:
    fields = {"image": "python:3.11", "app_name": f"test-{uuid.uuid4().hex[:8]}", "repo": None, **overrides}
    return ModalDeploymentConfig(**fields)


def agent_with(**deployment_fields: Any) -> AgentConfig:
    fields = {"image": "python:3.11", "app_name": f"test-{uuid.uuid4().hex[:8]}", **deployment_fields}
    return AgentConfigs.load(MODAL_CONFIG).override_all({"env": {"deployment": fields}}).validated["swe_agent"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "a.txt").write_bytes(b"original a\n")
    return repo


# -- the fake is faithful --------------------------------------------------------------------------------------------


def test_the_fake_rejects_what_the_sdk_rejects(cloud: FakeCloud) -> None:
    modal = cloud.module

    async def main() -> None:
        app = await modal.App.lookup.aio("x", create_if_missing=True)
        image = modal.Image.from_registry("python:3.11")
        with pytest.raises(TypeError):
            await modal.Sandbox.create.aio("true", app=app, image=image, no_such_argument=1)
        with pytest.raises(TypeError):
            await modal.App.lookup.aio("x", create=True)
        with pytest.raises(AssertionError, match="blocking"):
            modal.Sandbox.create("true", app=app, image=image)
        with pytest.raises(TypeError):
            modal.Image.from_registry()  # the tag is required
        sandbox = await modal.Sandbox.create.aio("sleep", "infinity", app=app, image=image, timeout=60)
        with pytest.raises(TypeError):
            await sandbox.exec.aio("true", cwd="/")
        await sandbox.terminate.aio()

    run(main())


# -- commands ------------------------------------------------------------------------------------------------------


def test_exec_semantics_timeouts_and_files(cloud: FakeCloud, repo: Path) -> None:
    marker = f"2903.{os.getpid() % 10000}"

    async def main() -> None:
        async with deployment(repo=str(repo)).build({"MY_VAR": "v 1"}, "exec") as box:
            ok = await box.exec("pwd; cat a.txt; echo err >&2; exit 4", 10)
            assert (ok.stdout, ok.exit_code, ok.timed_out) == (b"/testbed\noriginal a\nerr\n", 4, False)
            separate = await box.exec("echo out; echo err >&2", 10, merge_stderr=False)
            assert (separate.stdout, separate.stderr) == (b"out\n", b"err\n")
            assert (await box.exec("cat; echo end", 10)).stdout == b"end\n"
            assert (await box.exec("tr a-z A-Z", 10, stdin=b"hi\n")).stdout == b"HI\n"
            assert (await box.exec("cd sub && export FOO=bar", 10)).exit_code == 0
            assert (await box.exec('pwd; echo "$FOO $MY_VAR"', 10)).stdout == b"/testbed/sub\nbar v 1\n"
            assert (await box.exec("git log --format=%s", 10)).stdout == b"uni-agent base snapshot\n"
            long = await box.exec(": " + "x" * 200_000 + "; echo long", 10)  # past argv's 128 KiB per string
            assert (long.stdout, long.exit_code) == (b"long\n", 0)
            data = bytes(range(256)) * 32
            await write_file(box, "/testbed/x/blob.bin", data)
            assert await read_file(box, "/testbed/x/blob.bin") == data
            started = time.monotonic()
            slow = await box.exec(f"sleep {marker} & sleep {marker}", 1)
            assert slow.timed_out and slow.exit_code is None and time.monotonic() - started < 8
            assert [p for p in processes_marked(cloud.marker) if f"sleep\0{marker}".encode()
                    in Path(f"/proc/{p}/cmdline").read_bytes()] == []
            net = await box.exec("cat /proc/net/dev", 10)
            assert [line.split(":")[0].strip() for line in net.output.splitlines()[2:]] == ["lo"]
            # A cancelled command is killed inside the sandbox (through a second exec), not left running.
            task = asyncio.create_task(box.exec(f"sleep {marker}1", 120))
            deadline = time.monotonic() + 20
            while not any(f"sleep\0{marker}1".encode() in _cmdline(p) for p in processes_marked(cloud.marker)):
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not any(f"sleep\0{marker}1".encode() in _cmdline(p) for p in processes_marked(cloud.marker))
            assert (await box.exec("echo after", 10)).stdout == b"after\n"

    run(main())


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_create_gets_the_deployment_settings(cloud: FakeCloud) -> None:
    config = deployment(cpu=2, memory=4096, deployment_timeout=1800.5, workdir="/work", block_network=False,
                        add_python="3.11", environment_name="dev", modal_sandbox_kwargs={"region": "us-east"})

    async def main() -> None:
        async with config.build({}, "settings") as box:
            assert (await box.exec("pwd", 10)).stdout == b"/work\n"

    run(main())
    (sandbox,) = cloud.sandboxes
    assert sandbox.kwargs["timeout"] == 1801  # Modal ends the sandbox itself at the deployment's lifetime
    assert (sandbox.kwargs["cpu"], sandbox.kwargs["memory"], sandbox.kwargs["workdir"]) == (2, 4096, "/work")
    assert sandbox.kwargs["block_network"] is False and sandbox.kwargs["region"] == "us-east"
    assert sandbox.kwargs["tags"] == {"uni-agent.sandbox": "1"} and sandbox.name.startswith("uni-agent-settings-")
    assert (cloud.images[0].tag, cloud.images[0].kwargs) == ("python:3.11", {"add_python": "3.11"})
    assert cloud.lookups == [{"name": config.app_name, "environment_name": "dev", "create_if_missing": True}]
    assert sandbox.terminated


def test_modal_sandbox_kwargs_cannot_override_owned_fields() -> None:
    with pytest.raises(ValueError, match="timeout"):
        ModalDeploymentConfig(image="x", modal_sandbox_kwargs={"timeout": 5})
    with pytest.raises(ConfigError, match="no_such_field"):
        AgentConfigs.load(MODAL_CONFIG).override_all({"env": {"deployment": {"no_such_field": 1}}})


# -- verification through the fake ----------------------------------------------------------------------------------


def test_bundled_task_verifies_gold_and_empty_in_a_modal_sandbox(cloud: FakeCloud) -> None:
    task = sorted(p.name for p in BUNDLED_DIR.iterdir() if (p / "instance.json").exists())[-1]
    instance = load_instance(BUNDLED_DIR / task)
    agent = AgentConfigs.load(MODAL_CONFIG).for_row("swe_agent", {
        "env": {"deployment": {"image": "python:3.11", "repo": f"bundled:{task}", "app_name": "verify-test"}},
        "reward": {"name": "swe_local", "metadata": {
            "test_patch": instance["test_patch"], "FAIL_TO_PASS": instance["FAIL_TO_PASS"],
            "PASS_TO_PASS": instance["PASS_TO_PASS"]}},
    }, task)

    async def main() -> tuple[Any, Any]:
        return await asyncio.gather(verify_patch(agent, instance["patch"], "gold"),
                                    verify_patch(agent, "", "empty"))

    gold, empty = run(main())
    assert (gold.reward, gold.status) == (1.0, "resolved"), (gold.error, gold.log_tail)
    assert (empty.reward, empty.status) == (0.0, "unresolved"), (empty.error, empty.log_tail)
    assert len(cloud.sandboxes) == 2 and not cloud.live()


# -- start limits ----------------------------------------------------------------------------------------------------


def test_starting_cap_and_create_rate_are_respected(cloud: FakeCloud) -> None:
    cloud.create_latency = 0.3
    config = deployment(max_starting=2, creates_per_second=10)

    async def main() -> None:
        boxes = [config.build({}, f"cap{i}") for i in range(6)]
        try:
            await asyncio.gather(*(b.start() for b in boxes))
        finally:
            await asyncio.gather(*(b.close() for b in boxes))

    run(main())
    assert len(cloud.sandboxes) == 6
    assert cloud.max_starting == 2  # never more than the cap between create and the first answered command
    gaps = [b - a for a, b in itertools.pairwise(cloud.create_times)]
    assert min(gaps) >= 0.1 - 0.01, gaps


def test_transient_create_errors_are_retried_and_permanent_ones_are_not(cloud: FakeCloud) -> None:
    cloud.failures["create"] += [ERR.ResourceExhaustedError("Sandbox creation rate limit exceeded"),
                                 ERR.InternalFailure("try again")]
    agent = agent_with(start_retries=3)

    async def start_and_close() -> None:  # one event loop: the session's stream lives in the loop that opened it
        box = await start_sandbox(agent, "retried")
        await box.close()

    run(start_and_close())
    assert len(cloud.create_times) == 3 and len(cloud.sandboxes) == 1

    cloud.failures["create"] += [ERR.InvalidError("bad image"), ERR.InvalidError("bad image")]
    with pytest.raises(SandboxError, match="InvalidError") as caught:
        run(start_sandbox(agent, "permanent"))
    assert not isinstance(caught.value, SandboxStartError)
    assert len(cloud.create_times) == 4  # one try only


def test_missing_credentials_fail_at_once_with_a_clear_error(cloud: FakeCloud) -> None:
    cloud.auth = "missing"
    started = time.monotonic()
    with pytest.raises(SandboxError, match="MODAL_TOKEN_ID") as caught:
        run(start_sandbox(agent_with(start_retries=3), "noauth"))
    assert not isinstance(caught.value, SandboxStartError)
    assert len(cloud.lookups) == 1 and cloud.create_times == []
    assert time.monotonic() - started < 5


def test_an_unanswered_lookup_is_bounded(cloud: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    cloud.auth = "hang"
    monkeypatch.setattr(modal_backend, "APP_LOOKUP_TIMEOUT_S", 0.5)
    started = time.monotonic()
    with pytest.raises(SandboxError, match="did not answer within 0.5s"):
        run(start_sandbox(agent_with(), "hang"))
    assert time.monotonic() - started < 5 and cloud.create_times == []


def test_missing_sdk_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "modal", None)  # `import modal` raises ImportError
    with pytest.raises(SandboxError, match=r"uni-agent\[modal\]"):
        run(deployment().build({}, "nosdk").start())


# -- no leak on any path -----------------------------------------------------------------------------------------------


def test_a_create_whose_answer_was_lost_is_found_by_name_and_terminated(cloud: FakeCloud) -> None:
    cloud.lose_create_responses = 1

    async def start_and_close() -> None:
        box = await start_sandbox(agent_with(start_retries=2), "lost")
        await box.close()

    run(start_and_close())
    assert len(cloud.sandboxes) == 2 and not cloud.live()  # the first (orphaned) one was terminated too


def test_cancelled_during_create_leaves_nothing(cloud: FakeCloud) -> None:
    async def main() -> None:
        cloud.create_gate = asyncio.Event()  # create hangs after the sandbox exists on the service
        task = asyncio.create_task(start_sandbox(agent_with(), "cancelled"))
        deadline = time.monotonic() + 10
        while not cloud.sandboxes:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert len(cloud.sandboxes) == 1 and not cloud.live()


def test_startup_timeout_fails_the_start_and_leaves_nothing(cloud: FakeCloud) -> None:
    cloud.create_latency = 30
    started = time.monotonic()
    with pytest.raises(SandboxStartError, match="startup_timeout=0.5"):
        run(start_sandbox(agent_with(startup_timeout=0.5, start_retries=1), "slow"))
    assert time.monotonic() - started < 10
    assert len(cloud.sandboxes) == 1 and not cloud.live()


def test_a_crash_during_setup_leaves_nothing(cloud: FakeCloud) -> None:
    cloud.failures["exec"] += [ERR.ConnectionError("stream reset"), ERR.ConnectionError("stream reset")]
    with pytest.raises(SandboxStartError, match="ConnectionError"):
        run(start_sandbox(agent_with(start_retries=2), "crash"))
    assert len(cloud.sandboxes) == 2 and not cloud.live()


def test_an_error_in_the_rollout_still_terminates(cloud: FakeCloud) -> None:
    async def main() -> None:
        async with deployment().build({}, "boom"):
            raise RuntimeError("the agent crashed")

    with pytest.raises(RuntimeError, match="agent crashed"):
        run(main())
    assert len(cloud.sandboxes) == 1 and not cloud.live()


def test_terminate_is_retried_and_a_dead_sandbox_is_an_infrastructure_error(cloud: FakeCloud) -> None:
    cloud.failures["terminate"] += [ERR.ConnectionError("reset")]

    async def main() -> None:
        box = deployment().build({}, "term")
        await box.start()
        cloud.sandboxes[0].ended = True  # Modal ended it (its timeout); close() must still call terminate
        cloud.sandboxes[0].kill_processes()
        with pytest.raises(SandboxError):
            await box.exec("true", 10)
        await box.close()
        await box.close()

    run(main())
    assert not cloud.live() and cloud.failures["terminate"] == []


def test_proxy_is_set_for_the_sdk_and_one_proxy_per_process(cloud: FakeCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("HTTPS_PROXY", "https_proxy"):
        # set, then removed: monkeypatch then undoes what the code sets too (a bare delenv of an unset name records
        # nothing, and HTTPS_PROXY=proxy.invalid outlived this test: every later pip in the session failed on it)
        monkeypatch.setenv(key, "unset-by-this-test")
        monkeypatch.delenv(key)

    async def main() -> None:
        async with deployment(proxy="http://proxy.invalid:3128").build({}, "proxy"):
            assert os.environ["HTTPS_PROXY"] == "http://proxy.invalid:3128"
        with pytest.raises(SandboxError, match="one proxy"):
            await deployment(proxy="http://other.invalid:1").build({}, "proxy2").start()

    run(main())


# -- the limiter -----------------------------------------------------------------------------------------------------


def test_starting_cap_holds_across_tasks_and_outlives_an_event_loop() -> None:
    """Every sandbox of a process starts on one event loop (a Dask worker's: the agent loops and verification run
    there), and a process may run loops one after another (asyncio.run): the cap holds within a loop and outlives
    it, and a loop ending with starts still waiting leaves nothing held."""
    cap = StartingCap(2)
    inside = 0
    peak = 0

    async def one() -> None:
        nonlocal inside, peak
        async with cap.slot():
            inside += 1
            peak = max(peak, inside)
            try:
                await asyncio.sleep(0.01)
            finally:
                inside -= 1

    async def many() -> None:
        await asyncio.gather(*(one() for _ in range(5)))

    async def left_waiting() -> None:  # asyncio.run cancels the tasks still running when main returns
        for _ in range(4):
            asyncio.get_running_loop().create_task(one())
        await asyncio.sleep(0)

    for main in (many, many, left_waiting, many):
        asyncio.run(main())
        assert cap.held == 0
    assert peak == 2 and cap.max_held == 2


def test_cancelled_waiters_do_not_lose_slots() -> None:
    async def main() -> None:
        cap = StartingCap(1)
        await cap.acquire()
        waiters = [asyncio.create_task(cap.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters[0].cancel()
        cap.release()  # handed to waiters[1] (waiters[0] is gone)
        waiters[2].cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        assert waiters[1].done() and not waiters[1].cancelled() and cap.held == 1
        cap.release()
        assert cap.held == 0
        # A grant that races a cancellation is passed on, not lost.
        await cap.acquire()
        late = asyncio.create_task(cap.acquire())
        await asyncio.sleep(0)
        cap.release()
        late.cancel()
        await asyncio.gather(late, return_exceptions=True)
        await asyncio.sleep(0)
        assert cap.held == (0 if late.cancelled() else 1)
        async with asyncio.timeout(5):
            async with cap.slot():
                assert cap.held == 1

    run(main())


def test_rate_limiter_spaces_events_and_allows_a_burst() -> None:
    limiter = RateLimiter(rate=20)
    delays = [limiter.reserve() for _ in range(5)]
    assert delays[0] == 0 and all(abs(b - a - 0.05) < 0.01 for a, b in itertools.pairwise(delays))
    bursty = RateLimiter(rate=10, burst=3)
    assert [round(bursty.reserve(), 2) for _ in range(5)] == [0, 0, 0, 0.1, 0.2]
