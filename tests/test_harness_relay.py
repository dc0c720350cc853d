"""The supervisor relay: a program in a sandbox with its network off reaches a host-side target through 127.0.0.1:PORT
inside, its bytes carried over the supervisor's own channel (supervisor.py's protocol, sandbox/relay.py).

Real sandboxes and real sockets: local (bubblewrap, network off), local over an image and podman (the test image of
test_sandbox_container), and Modal through its fake SDK (test_sandbox_modal: the cloud cannot be reached from here;
the fake runs the real supervisor in bubblewrap with `--unshare-net`, so the relay is exercised for real).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from test_sandbox_container import image  # noqa: F401 - the podman test image, a session fixture
from test_sandbox_modal import cloud  # noqa: F401 - the fake Modal cloud, a fixture
from test_sandbox_modal import deployment as modal_deployment

from uni_agent.sandbox import Sandbox
from uni_agent.sandbox.container import ContainerDeploymentConfig
from uni_agent.sandbox.local import LocalDeploymentConfig
from uni_agent.sandbox.relay import tcp_target

T = TypeVar("T")
BACKENDS = ["local", "local-image", "podman", "modal-fake"]

# Run inside the sandbox: N connections at once, each sends SIZE random bytes, half-closes, and reads the echo back.
CLIENT = r"""
import hashlib, os, socket, sys, threading
port, n, size = (int(x) for x in sys.argv[1:4])
ok = []
def one(i):
    data = os.urandom(size)
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = bytearray()
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    ok.append(hashlib.sha256(bytes(got)).hexdigest() == hashlib.sha256(b"echo:" + data).hexdigest())
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
[t.start() for t in threads]
[t.join() for t in threads]
print("ok" if len(ok) == n and all(ok) else "bad %r" % ok)
"""


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("UNI_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("UNI_AGENT_IMAGE_CACHE", str(tmp_path / "images"))
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    return repo


@pytest.fixture(params=BACKENDS)
def open_sandbox(request: pytest.FixtureRequest, repo: Path) -> Callable[[], Sandbox]:
    backend = request.param
    if backend == "modal-fake":
        request.getfixturevalue("cloud")
        return lambda: modal_deployment(repo=str(repo)).build({}, "relay")
    if backend == "local":
        return lambda: LocalDeploymentConfig(repo=str(repo)).build({}, "relay")
    tag = request.getfixturevalue("image")
    if backend == "local-image":
        return lambda: LocalDeploymentConfig(image=tag, repo=str(repo)).build({}, "relay")
    config = ContainerDeploymentConfig(type="podman", image=tag, pull="never", repo=str(repo))
    return lambda: config.build({}, "relay")


async def echo_server() -> tuple[asyncio.Server, int, list[int]]:
    """A host-side target: answers b"echo:" + everything the connection sent, once the client half-closes."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read()
        seen.append(len(data))
        writer.write(b"echo:" + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], seen


def with_box(make: Callable[[], Sandbox], body: Callable[[Sandbox], Awaitable[T]]) -> T:
    async def main() -> T:
        async with make() as box:
            return await body(box)

    return asyncio.run(main())


def test_connections_inside_a_sandbox_without_network_reach_the_host_target(
        open_sandbox: Callable[[], Sandbox]) -> None:
    async def body(box: Sandbox) -> tuple[Any, ...]:
        server, host_port, seen = await echo_server()
        async with server:
            port = await box.session.listen(tcp_target("127.0.0.1", host_port))  # type: ignore[attr-defined]
            await box.exec(f"cat > /tmp/client.py <<'EOF'\n{CLIENT}\nEOF", 10)
            relayed = await box.exec(f"python3 /tmp/client.py {port} 4 1000000", 120)
            # the host's own port is not reachable from inside: the network is off, only the relay goes out
            direct = await box.exec(f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {host_port}),"
                                    " timeout=3)\"", 30)
            after = await box.exec("echo after", 10)
            return relayed, direct, after, sorted(seen), box.session.relay.connections  # type: ignore[attr-defined]

    relayed, direct, after, seen, count = with_box(open_sandbox, body)
    assert relayed.output.strip() == "ok", relayed.output
    assert seen == [1000000] * 4 and count == 4
    assert direct.exit_code != 0 and "refused" in direct.output.lower(), direct.output
    assert after.output == "after\n"


def test_a_target_that_refuses_closes_the_connection_and_the_sandbox_goes_on(repo: Path) -> None:
    async def body(box: Sandbox) -> tuple[Any, ...]:
        probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        dead_port = probe.sockets[0].getsockname()[1]
        probe.close()
        await probe.wait_closed()
        port = await box.session.listen(tcp_target("127.0.0.1", dead_port))  # type: ignore[attr-defined]
        read = await box.exec(f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port})); "
                              "s.sendall(b'x'); print(repr(s.recv(10)))\"", 30)
        return read, await box.exec("echo after", 10)

    read, after = with_box(lambda: LocalDeploymentConfig(repo=str(repo)).build({}, "relay"), body)
    assert read.exit_code == 0 and read.output.strip() in ("b''",), read.output
    assert after.output == "after\n"


def test_closing_a_sandbox_with_connections_open_leaves_no_task(repo: Path) -> None:
    """A program that holds its connection open when the sandbox closes: the host's side of it ends too."""

    async def main() -> tuple[int, bool, int]:
        ended = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read()  # until the relay's side of the connection closes
            ended.set()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        async with server:
            box = LocalDeploymentConfig(repo=str(repo)).build({}, "relay")
            async with box:
                port = await box.session.listen(tcp_target("127.0.0.1", server.sockets[0].getsockname()[1]))
                await box.exec(f"nohup python3 -c \"import socket, time; s = socket.create_connection(('127.0.0.1', "
                               f"{port})); time.sleep(300)\" >/dev/null 2>&1 &", 10)
                for _ in range(100):
                    if box.session.relay.connections:
                        break
                    await asyncio.sleep(0.05)
                relay = box.session.relay
            await asyncio.wait_for(ended.wait(), 5)
            return relay.connections, ended.is_set(), len(relay._tasks)

    opened, ended, left = asyncio.run(main())
    assert (opened, ended, left) == (1, True, 0)


def test_bytes_are_intact_in_both_directions_with_a_slow_reader(repo: Path) -> None:
    """The host sends 8 MB to a program that reads slowly: the supervisor buffers, nothing is lost or reordered."""
    payload = os.urandom(8 << 20)

    async def body(box: Sandbox) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(payload)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        async with server:
            port = await box.session.listen(tcp_target("127.0.0.1", server.sockets[0].getsockname()[1]))
            return await box.exec(
                f"python3 -c \"import socket, time, hashlib; s = socket.create_connection(('127.0.0.1', {port})); "
                "h = hashlib.sha256(); n = 0\nwhile True:\n chunk = s.recv(4096)\n if not chunk: break\n "
                "h.update(chunk); n += len(chunk)\n if n < 65536: time.sleep(0.01)\nprint(n, h.hexdigest())\"", 120)

    result = with_box(lambda: LocalDeploymentConfig(repo=str(repo)).build({}, "relay"), body)
    assert result.output.split() == [str(len(payload)), hashlib.sha256(payload).hexdigest()], result.output


def test_a_program_that_outruns_its_target_loses_the_connection_not_the_workers_memory(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The target takes nothing; the program sends 64 MB (more than the kernel's socket buffers hold) over a limit of
    1 MB queued: its connection ends (it sees
    end of file), the host held at most the limit plus one chunk, and the sandbox and its relay go on."""
    from uni_agent.sandbox import relay

    monkeypatch.setattr(relay, "INBOX_LIMIT_BYTES", 1 << 20)
    peak: list[int] = []
    received = relay.Relay.received

    def watched(self: relay.Relay, conn_id: int, data: bytes) -> None:
        received(self, conn_id, data)
        peak.append(self._queued.get(conn_id, 0))

    monkeypatch.setattr(relay.Relay, "received", watched)

    async def body(box: Sandbox) -> Any:
        stalled = asyncio.Event()

        async def never_reads(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.transport.pause_reading()  # the target's socket buffer fills, then the relay's queue
            await stalled.wait()
            writer.close()

        server = await asyncio.start_server(never_reads, "127.0.0.1", 0)
        async with server:
            port = await box.session.listen(tcp_target("127.0.0.1", server.sockets[0].getsockname()[1]))
            flood = await box.exec(
                f"python3 -c \"import socket; s = socket.create_connection(('127.0.0.1', {port})); sent = 0\n"
                "try:\n while sent < 64 << 20: sent += s.send(b'x' * 65536)\nexcept OSError as e: print('send', e)\n"
                "s.settimeout(20); print('eof' if s.recv(1) == b'' else 'data')\"", 60)
            stalled.set()
            echo_srv, echo_port, _ = await echo_server()
            async with echo_srv:
                port2 = await box.session.listen(tcp_target("127.0.0.1", echo_port))
                after = await box.exec(f"python3 -c '{CLIENT}' {port2} 2 1000", 60)
        return flood, after

    flood, after = with_box(lambda: LocalDeploymentConfig(repo=str(repo)).build({}, "relay"), body)
    assert "eof" in flood.output or "send" in flood.output, flood.output
    assert max(peak) <= (1 << 20) + 65536, max(peak)
    assert after.output.strip() == "ok", after.output
