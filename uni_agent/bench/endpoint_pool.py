"""The simulation's LLM endpoint: N processes sharing one port, each an asyncio HTTP/1.1 server, so that it is never
the bottleneck at thousands of rollouts in flight (a thread per connection, as ScriptedLLM has, would be 20,000
threads in one process).

Each process answers POST .../chat/completions after `delay_s` with the benchmark's scripted reply (BenchPolicy:
`turns` execute_bash calls, then submit) and GET .../models; keep-alive connections, as vLLM offers them. The kernel
spreads new connections over the processes (SO_REUSEPORT). With `addresses` > 1 every process listens on
127.0.0.1, 127.0.0.2, ... (all of 127/8 is this host's) at the same port and `base_url` names them all, comma-separated,
as replicas: one address takes at most 45% of the kernel's ephemeral ports in connections, below the point where
each connect() starts searching the whole range (bench/measure.py, connections_per_address). It speaks only the small part of HTTP/1.1 that the
OpenAI clients use (Content-Length bodies, no chunked requests): a latency-controlled stand-in, not a server.

    python -m uni_agent.bench.endpoint_pool --port P --hosts 127.0.0.1,127.0.0.2 --delay-s 20 --turns 4 --command ls
    # one process: prints {"ready": port} once listening; serves until stdin closes, then prints its figures
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import socket
import subprocess
import sys
import time
from typing import Any

from ..testing.scripted_llm import chat_completion
from .endpoint import BenchPolicy
from .lifetime import die_with_bench

MODEL = "scripted"


class _Figures:
    def __init__(self) -> None:
        self.requests = 0
        self.late_max_s = 0.0  # how much later than `delay_s` a reply left (event-loop lag: an overloaded endpoint)
        self.late_sum_s = 0.0


async def _serve(hosts: list[str], port: int, delay_s: float, policy: BenchPolicy, figures: _Figures) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                received = time.monotonic()
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ", 2)[:2]
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                length = int(headers.get("content-length") or 0)
                data = await reader.readexactly(length) if length else b""
                if method == "GET" and path.rstrip("/").endswith("/models"):
                    status, body = 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                elif method == "POST":
                    request = json.loads(data or b"{}")
                    figures.requests += 1
                    await asyncio.sleep(delay_s - (time.monotonic() - received))
                    late = time.monotonic() - received - delay_s
                    figures.late_max_s = max(figures.late_max_s, late)
                    figures.late_sum_s += late
                    status, body = 200, chat_completion(policy(request), request, MODEL)
                else:
                    status, body = 404, {}
                payload = json.dumps(body).encode()
                writer.write(f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: "
                             f"{len(payload)}\r\n\r\n".encode() + payload)
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # the client went away, or we are shutting down with the connection idle
        finally:
            writer.close()

    server = await asyncio.start_server(handle, hosts, port, reuse_port=True, backlog=8192)
    print(json.dumps({"ready": port}), flush=True)
    async with server:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.endpoint_pool")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--hosts", default="127.0.0.1", help="comma-separated addresses to listen on")
    parser.add_argument("--delay-s", type=float, required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args(argv)
    figures = _Figures()
    asyncio.run(_serve(args.hosts.split(","), args.port, args.delay_s, BenchPolicy(args.turns, args.command), figures))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    try:
        print(json.dumps({"requests": figures.requests, "cpu_s": usage.ru_utime + usage.ru_stime,
                          "late_max_s": figures.late_max_s, "late_sum_s": figures.late_sum_s}), flush=True)
    except BrokenPipeError:  # the bench is gone: nobody to tell
        return 1
    return 0


class EndpointPool:
    """`with EndpointPool(processes, delay_s, turns, command) as ep: ep.base_url, ep.pids`; `ep.stats` after exit."""

    def __init__(self, processes: int, delay_s: float, turns: int, command: str, addresses: int = 1):
        self.processes, self.delay_s, self.turns, self.command = processes, delay_s, turns, command
        self.hosts = [f"127.0.0.{i}" for i in range(1, addresses + 1)]
        self.stats: dict[str, Any] = {}
        self.procs: list[subprocess.Popen] = []

    def __enter__(self) -> EndpointPool:
        # Hold bound (never listening) sockets on the port while the servers start, so no one else takes it.
        holders, port = _hold_port(self.hosts)
        try:
            for _ in range(self.processes):
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "uni_agent.bench.endpoint_pool", "--port", str(port), "--hosts",
                     ",".join(self.hosts), "--delay-s", str(self.delay_s), "--turns", str(self.turns),
                     "--command", self.command],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_bench()))
            for proc in self.procs:
                if not (proc.stdout and proc.stdout.readline()):
                    raise RuntimeError("an endpoint process did not start")
        except BaseException:
            self.__exit__()
            raise
        finally:
            for holder in holders:
                holder.close()
        self.base_url = ",".join(f"http://{host}:{port}/v1" for host in self.hosts)
        self.pids = [p.pid for p in self.procs]
        return self

    def __exit__(self, *exc: object) -> None:
        figures = []
        for proc in self.procs:
            try:
                out, _ = proc.communicate(input="", timeout=30)
                figures.append(json.loads(out.strip().splitlines()[-1]))
            except (subprocess.TimeoutExpired, ValueError, IndexError):
                proc.kill()
                proc.wait()
        self.stats = {"processes": self.processes, "requests": sum(f["requests"] for f in figures),
                      "cpu_s": sum(f["cpu_s"] for f in figures),
                      "late_max_s": max((f["late_max_s"] for f in figures), default=float("nan"))}
        requests = self.stats["requests"]
        self.stats["late_mean_s"] = sum(f.get("late_sum_s", 0.0) for f in figures) / requests if requests else None


def _hold_port(hosts: list[str]) -> tuple[list[socket.socket], int]:
    """Sockets bound (SO_REUSEPORT) to one port free on every host, and the port."""
    for _ in range(20):
        holders = []
        try:
            for host in hosts:
                holder = socket.socket()
                holders.append(holder)
                holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
                holder.bind((host, holders[0].getsockname()[1] if len(holders) > 1 else 0))
            return holders, holders[0].getsockname()[1]
        except OSError:  # that port is taken on another address: another one
            for holder in holders:
                holder.close()
    raise RuntimeError(f"no port free on all of {', '.join(hosts)}")


if __name__ == "__main__":
    sys.exit(main())
