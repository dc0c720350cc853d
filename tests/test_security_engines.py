"""Another user on the node against the run's engine and model gateway: nothing answers them.

The engine is a real llama-server started the way a run starts it (uni_agent.driver.cluster.cluster_client, the run's
TLS LocalCluster, then uni_agent.engines.start_engines). A second real user (tests/unprivileged.py) tries every
endpoint a stranger would: a chat completion, the slot listing, saving a slot into the run's output dir (a disk
filler), erasing a slot that serves the run, reading the live prompt back through /tokenize and /detokenize, /metrics,
/props, /v1/models; each must be refused (401). The same attacks against a server as 04c908e started it (no key in
its environment, slots listed, slot files saved) succeed, so each check here can fail. The run's own clients (the
agents' ChatClient, the prompt sharing, the engine versions in run.json) still work with the run's key, which is on
no process's command line and in no log. The harness model gateway: its sockets are in a directory of ours alone, and
its TCP door (the benchmark's) answers no call without a rollout's token.

The victim here is root (the test process) and the stranger an ordinary user: what protects the run is the key and
file modes, which hold the same for any victim.
"""

import asyncio
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from unprivileged import ensure_user, run_python_as
from uni_agent.engines.llama_build import find_binary
from uni_agent.engines.llama_cpp import LlamaServer, default_model_path, server_command
from uni_agent.engines.process import free_port, launch, terminate
from uni_agent.engines.shared_prompt import SLOT_FILE, share_prompt
from uni_agent.harness.gateway import Gateway, Lease
from uni_agent.llm import ChatClient
from uni_agent.private_dirs import private_tmp

pytestmark = pytest.mark.skipif(find_binary("cpu") is None, reason="no llama-server build: run examples/setup.sh")
STRANGER = "ua-sec-engine"
MODEL = "smol"

# What the stranger sends (method, path, JSON body), by attack; run as the stranger with the standard library only.
ATTACKS: dict[str, tuple[str, str, Any]] = {
    "chat completion": ("POST", "/v1/chat/completions",
                        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    "legacy completion": ("POST", "/completion", {"prompt": "hi", "n_predict": 2}),
    "list models": ("GET", "/v1/models", None),
    "list slots (live prompts)": ("GET", "/slots", None),
    "save a slot (disk filler)": ("POST", "/slots/0?action=save", {"filename": "stranger.bin"}),
    "restore a slot": ("POST", "/slots/0?action=restore", {"filename": "stranger.bin"}),
    "erase a slot": ("POST", "/slots/0?action=erase", None),
    "tokenize": ("POST", "/tokenize", {"content": "hello"}),
    "detokenize (read a prompt back)": ("POST", "/detokenize", {"tokens": [1, 2, 3]}),
    "metrics": ("GET", "/metrics", None),
    "props": ("GET", "/props", None),
    "a guessed key": ("POST", "/v1/chat/completions",
                      {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
}
STRANGER_SCRIPT = """
import json, sys, urllib.request, urllib.error
root, attacks = sys.argv[1], json.loads(sys.argv[2])
outcome = {}
for name, (method, path, body) in attacks.items():
    headers = {"Content-Type": "application/json"}
    if name == "a guessed key":
        headers["Authorization"] = "Bearer sk-no-key-required"
    data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
    request = urllib.request.Request(root + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            outcome[name] = [answer.status, answer.read(300).decode(errors="replace")]
    except urllib.error.HTTPError as exc:
        outcome[name] = [exc.code, exc.read(300).decode(errors="replace")]
    except OSError as exc:
        outcome[name] = [None, repr(exc)]
print(json.dumps(outcome))
"""
ENVIRON_SCRIPT = """
import sys
try:
    print(len(open(f"/proc/{sys.argv[1]}/environ", "rb").read()))
except OSError as exc:
    print(type(exc).__name__)
"""


@pytest.fixture(scope="module")
def stranger():
    return ensure_user(STRANGER)


def attack(user, url: str) -> dict[str, list]:
    done = run_python_as(user, f"import sys; sys.argv[1:] = {[url.removesuffix('/v1'), json.dumps(ATTACKS)]!r}\n"
                         + STRANGER_SCRIPT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


class RunEngine(threading.Thread):
    """The run's cluster and engine (cluster_client + start_engines) on an event loop of their own, kept up until
    `close`."""

    def __init__(self, out: Path):
        super().__init__(daemon=True)
        from uni_agent.settings import RunSettings

        self.settings = RunSettings(engine="llama_cpp", engine_device="cpu", engine_parallel=2, context_length=1024,
                                    engine_threads=1, local_workers=1, output_dir=str(out))
        self.log_dir = out / "logs"
        self.ready, self.done = threading.Event(), threading.Event()
        self.engines: Any = None
        self.error: BaseException | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from uni_agent.driver.cluster import cluster_client
        from uni_agent.engines import start_engines

        self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            async with cluster_client(self.settings) as client:
                self.engines = await start_engines(client, self.settings, str(self.log_dir))
                try:
                    self.ready.set()
                    await self._stop.wait()
                finally:
                    await self.engines.stop()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            self.error = exc
        finally:
            self.ready.set()
            self.done.set()

    def call(self, coro: Any, timeout: float = 300) -> Any:
        assert self.loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if self.loop is not None and self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.done.wait(120)


@pytest.fixture(scope="module")
def run_engine(tmp_path_factory):
    engine = RunEngine(tmp_path_factory.mktemp("run") / "out")
    engine.start()
    engine.ready.wait(600)
    try:
        if engine.error is not None:
            raise engine.error
        yield engine
    finally:
        engine.close()


def _old_command(binary: str, port: int, slot_dir: Path) -> list[str]:
    """The command line 04c908e started a run's llama-server with: today's, with the slot listing on and slot files
    saved (it always gave --slot-save-path), and no key in its environment."""
    command = server_command(binary, default_model_path(), MODEL, host="127.0.0.1", port=port, slots=2,
                             context_length=1024, threads=1, gpu=False, slot_save_path=str(slot_dir))
    return [arg for arg in command if arg != "--no-slots"]


@pytest.fixture(scope="module")
def old_server(tmp_path_factory):
    """A llama-server started as 04c908e started one (the control: the attacks must succeed against it)."""
    where = tmp_path_factory.mktemp("old")
    slot_dir = where / "engine-0.slots"
    slot_dir.mkdir()
    port = free_port("127.0.0.1")
    url = f"http://127.0.0.1:{port}/v1"
    with BackgroundLoop() as loop:
        proc = loop.call(launch(_old_command(str(find_binary("cpu")), port, slot_dir), str(where / "engine.log"), {}))
        try:
            loop.call(_wait_answering(url, None))
            yield url, slot_dir
        finally:
            loop.call(terminate(proc))


class BackgroundLoop:
    """An event loop in a thread of its own, for servers that must answer while the test waits on a stranger."""

    def __enter__(self) -> "BackgroundLoop":
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        return self

    def call(self, coro: Any, timeout: float = 300) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def __exit__(self, *exc: Any) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


async def _wait_answering(url: str, key: str | None, timeout: float = 120) -> None:
    from uni_agent.llm import check_endpoint

    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            await check_endpoint(url, key, timeout=5)
            return
        except Exception:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


def _server_pids(port: int) -> list[int]:
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"llama-server") and str(port).encode() in cmd:
            pids.append(int(proc.name))
    return pids


# ---- the engine ----------------------------------------------------------------------------------------------------

def test_every_endpoint_refuses_a_stranger_and_answered_one_before(run_engine, old_server, stranger):
    url = run_engine.engines.urls[0]
    before = attack(stranger, old_server[0])
    now = attack(stranger, url)
    table = "\n".join(f"{name:34} 04c908e: {before[name][0]}  now: {now[name][0]}" for name in ATTACKS)
    print(table)
    # the control: as 04c908e started it, every attack got in (the saved slot file is on disk, written as the run)
    assert all(before[name][0] == 200 for name in ATTACKS), table + "\n" + json.dumps(before)[:3000]
    assert (old_server[1] / "stranger.bin").stat().st_size > 0
    assert '"content"' in before["detokenize (read a prompt back)"][1]  # tokens read back as text
    # now: every endpoint but /health wants the run's key
    assert all(now[name][0] == 401 for name in ATTACKS), table + "\n" + json.dumps(now)[:3000]
    slot_dir = Path(run_engine.log_dir) / "engine-0.slots"
    assert not (slot_dir / "stranger.bin").exists()


def test_the_runs_own_clients_work_with_its_key(run_engine):
    """The agents' client, the prompt sharing (slot save and restore) and the engine versions, all with the key."""
    from uni_agent.driver.manifest import engine_versions

    engines = run_engine.engines
    url, key = engines.urls[0], engines.api_key
    assert key and len(key) >= 40

    async def use():
        client = ChatClient(url, engines.model_name, key, max_attempts=2)
        try:
            reply = await client.chat([{"role": "user", "content": "Say hi."}])
        finally:
            await client.aclose()
        shared = await share_prompt([url], engines.model_name, [{"role": "system", "content": "Be brief. " * 30},
                                                                  {"role": "user", "content": "hi"}], None,
                                    api_key=key)
        versions = await engine_versions([url], key)
        keyless = await engine_versions([url], None)
        import httpx

        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as http:
            listing = (await http.get(url.removesuffix("/v1") + "/slots")).status_code
        return reply, shared, versions, keyless, listing

    reply, shared, versions, keyless, listing = run_engine.call(use())
    assert listing == 501  # the slot listing is off even for the run: nothing of ours reads it
    assert reply.completion_tokens > 0
    assert shared[0]["slots"] == 2 and shared[0]["prompt_tokens"] > 50
    slot_dir = Path(run_engine.log_dir) / "engine-0.slots"
    assert (slot_dir / SLOT_FILE).is_file() and slot_dir.stat().st_mode & 0o777 == 0o700
    assert "build_info" in versions[0] and "build_info" not in keyless[0]  # /props asks for the key too


def test_the_key_is_on_no_command_line_and_in_no_log(run_engine, stranger):
    key = run_engine.engines.api_key
    url = run_engine.engines.urls[0]
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    pids = _server_pids(port)
    assert pids, "the run's llama-server is not running?"
    on_command_lines = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if key.encode() in (proc / "cmdline").read_bytes():
                on_command_lines.append(proc.name)
        except OSError:
            continue
    assert not on_command_lines
    # the server has it, in its environment, which only its owner can read
    assert f"LLAMA_API_KEY={key}".encode() in Path(f"/proc/{pids[0]}/environ").read_bytes().split(b"\0")
    read = run_python_as(stranger, f"import sys; sys.argv[1:] = [{str(pids[0])!r}]\n" + ENVIRON_SCRIPT)
    assert read.stdout.strip() == "PermissionError", read.stdout + read.stderr
    for log in Path(run_engine.log_dir).rglob("*"):
        if log.is_file() and log.suffix in (".log", ".jsonl", ".txt"):
            assert key not in log.read_text(errors="replace"), log


def test_a_server_driven_without_the_run_keeps_no_slot_files(tmp_path):
    """LlamaServer with slot saving off (engine_share_prompt false): no slot file can be written at all."""
    server = LlamaServer(default_model_path(), MODEL, variant="cpu", slots=1, context_length=512, threads=1,
                         log_path=str(tmp_path / "engine.log"), api_key="k" * 43)

    async def scenario():
        import httpx

        url = await server.start(120)
        try:
            async with httpx.AsyncClient(headers={"Authorization": "Bearer " + "k" * 43}) as http:
                saved = await http.post(url.removesuffix("/v1") + "/slots/0?action=save", json={"filename": "x.bin"})
            return saved.status_code
        finally:
            await server.stop()

    assert asyncio.run(scenario()) == 501  # "This server does not support slots action"
    assert not server.slot_dir.exists()


# ---- the model gateway ---------------------------------------------------------------------------------------------

CONNECT_SCRIPT = """
import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
    print("CONNECTED")
except OSError as exc:
    print(type(exc).__name__)
"""


def test_the_gateway_refuses_a_stranger(stranger):
    """A rollout's door (a Unix socket) cannot even be connected to; the TCP door wants a rollout's token."""

    class Unreachable:
        async def chat(self, *args: Any, **kwargs: Any) -> Any:
            raise AssertionError("a stranger's call reached the model")

    with BackgroundLoop() as loop:
        unix, tcp = loop.call(Gateway().start()), loop.call(Gateway().start(tcp=True))
        try:
            lease = Lease(Unreachable(), MODEL, max_calls=3, deadline=None)
            for gateway in (unix, tcp):
                gateway.register(lease)
            loop.call(unix.door(lease))
            [door] = Path(unix.socket_dir).glob("*.sock")
            connected = run_python_as(stranger, f"import sys; sys.argv[1:] = [{str(door)!r}]\n" + CONNECT_SCRIPT)
            calls = attack(stranger, tcp.url)
            socket_dir = Path(unix.socket_dir)
            # the sockets live in the user's private scratch, in a directory of ours alone
            assert socket_dir.parent == private_tmp()
            assert socket_dir.stat().st_mode & 0o777 == 0o700 and socket_dir.stat().st_uid == os.geteuid()
        finally:
            for gateway in (unix, tcp):
                loop.call(gateway.close())
    assert connected.stdout.strip() == "PermissionError", connected.stdout + connected.stderr
    for name in ("chat completion", "list models", "a guessed key"):
        assert calls[name][0] == 401, calls
