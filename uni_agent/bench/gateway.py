"""`uni-agent bench --gateway`: what the model gateway (uni_agent.harness) adds to each model call of a harness program.

The engine is a fixed-answer OpenAI endpoint in its own process (aiohttp, no delay: what is left is overhead; the
scripted endpoint of the sweep answers keep-alive requests in two writes, which costs a delayed-ACK wait). The same
chat request (a tool list and a two-message conversation) is sent CALLS times, one after another, four ways:
- direct: a program (a stdlib HTTP client with a keep-alive connection, in its own process) calls the endpoint itself;
- our loop: this process's ChatClient calls it, as UniAgentLoop does (its CPU is the agent worker's per call);
- gateway: the program calls the gateway (TCP on 127.0.0.1), which forwards through a ChatClient;
- gateway over the relay: the program runs in a local sandbox with the network off and reaches the gateway through
  the supervisor's relay (sandbox/relay.py), as a harness program does.
Latency is what the program measured per call (p50/p95); worker CPU is this process's CPU (getrusage) over the calls
divided by the calls: the gateway, the relay's host side and the forwarding client, but not the program, the
supervisor or the endpoint. Every figure comes from the same run.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..config import LocalDeploymentConfig
from ..harness.gateway import Gateway, Lease
from ..llm import ChatClient
from ..sandbox import make_sandbox
from .measure import cpu_now, load_average, percentile

BASH = {"type": "function", "function": {"name": "bash", "description": "run a command", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
WARM_UP = 30  # calls before each measured path (first requests pay for code paths run once)
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "List the files, then submit."}]

# The program: CALLS chat requests on one keep-alive connection, each timed; prints the seconds as JSON.
PROGRAM = r"""
import http.client, json, os, sys, time, urllib.parse
url = urllib.parse.urlsplit(os.environ["OPENAI_BASE_URL"])
body = os.environ["BENCH_BODY"].encode()
headers = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"}
connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
seconds = []
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    connection.request("POST", url.path.rstrip("/") + "/chat/completions", body, headers)
    answer = connection.getresponse()
    data = answer.read()
    seconds.append(time.perf_counter() - started)
    if answer.status != 200:
        sys.exit("HTTP %d: %s" % (answer.status, data[:300]))
print(json.dumps(seconds))
"""


# The engine: one fixed chat.completion (a `bash` tool call) for every request; prints its port, serves until stdin ends.
ENGINE = r"""
import asyncio, json, sys
from aiohttp import web
ANSWER = json.dumps({"id": "chatcmpl-bench", "object": "chat.completion", "model": "scripted", "choices": [{
    "index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": "THOUGHT: look.",
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})}}]}}],
    "usage": {"prompt_tokens": 20, "completion_tokens": 10}}).encode()
async def chat(request):
    await request.read()
    return web.Response(body=ANSWER, content_type="application/json")
async def main():
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(site._server.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""


def _program_env(base_url: str, key: str) -> dict[str, str]:
    return {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key,
            "BENCH_BODY": json.dumps({"model": "scripted", "messages": MESSAGES, "tools": [BASH]})}


async def _host_program(base_url: str, key: str, calls: int) -> list[float]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-c", PROGRAM, str(calls), env={**os.environ, **_program_env(base_url, key)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the benchmark program failed: {err.decode()[-2000:]}")
    return json.loads(out)


def _figures(name: str, seconds: list[float], cpu_s: float, calls: int) -> dict[str, Any]:
    ms = sorted(s * 1000 for s in seconds)
    return {"path": name, "calls": calls, "p50_ms": percentile(ms, 0.5), "p95_ms": percentile(ms, 0.95),
            "worker_cpu_ms_per_call": cpu_s / calls * 1000 if cpu_s == cpu_s else float("nan")}


async def measure(base_url: str, calls: int) -> list[dict[str, Any]]:
    rows = []
    # direct: the program against the endpoint (this process idle)
    rows.append(_figures("direct (program -> engine)", await _host_program(base_url, "bench", calls), float("nan"),
                         calls))
    client = ChatClient(base_url, "scripted", "bench", max_attempts=1)
    try:
        await client.chat(MESSAGES, [BASH])  # the connection pool warm, as in a running worker
        before, seconds = cpu_now(), []
        for _ in range(calls):
            started = time.perf_counter()
            await client.chat(MESSAGES, [BASH])
            seconds.append(time.perf_counter() - started)
        rows.append(_figures("our loop (ChatClient -> engine)", seconds, (cpu_now() - before).own, calls))
        gateway = await Gateway().start(tcp=True)
        try:
            lease = Lease(client, "scripted", max_calls=10 * calls, deadline=None)
            gateway.register(lease)
            await _host_program(gateway.url, lease.token, WARM_UP)
            before = cpu_now()
            seconds = await _host_program(gateway.url, lease.token, calls)
            rows.append(_figures("gateway (program -> gateway -> engine)", seconds, (cpu_now() - before).own,
                                 calls))
        finally:
            await gateway.close()
        rows.append(await _through_relay(client, calls))
    finally:
        await client.aclose()
    return rows


async def _through_relay(client: ChatClient, calls: int) -> dict[str, Any]:
    gateway = await Gateway().start()
    repo = Path(tempfile.mkdtemp(prefix="uni-agent-bench-gateway-"))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    try:
        lease = Lease(client, "scripted", max_calls=10 * calls, deadline=None)
        gateway.register(lease)
        async with make_sandbox(LocalDeploymentConfig(repo=str(repo)), {}, "bench-gateway") as box:
            port = await box.session.listen(gateway.connect())  # type: ignore[attr-defined]
            env = _program_env(f"http://127.0.0.1:{port}/v1", lease.token)
            exports = " ".join(f"{k}={json.dumps(v)}" for k, v in env.items())
            await box.exec(f"cat > /tmp/program.py <<'EOF'\n{PROGRAM}\nEOF", 10)
            await box.exec(f"env {exports} python3 /tmp/program.py {WARM_UP}", 600)
            before = cpu_now()
            result = await box.exec(f"env {exports} python3 /tmp/program.py {calls}", 600)
            cpu = (cpu_now() - before).own
        if result.exit_code != 0:
            raise RuntimeError(f"the benchmark program failed in the sandbox: {result.output[-2000:]}")
        return _figures("gateway over the relay (sandbox, network off)", json.loads(result.stdout), cpu, calls)
    finally:
        await gateway.close()
        subprocess.run(["rm", "-rf", str(repo)], check=False)


def table(rows: list[dict[str, Any]]) -> list[str]:
    base = rows[0]["p50_ms"]
    lines = [f"{'path':<48} {'p50 ms':>8} {'p95 ms':>8} {'added p50':>10} {'worker CPU ms/call':>19}"]
    for row in rows:
        cpu = row["worker_cpu_ms_per_call"]
        lines.append(f"{row['path']:<48} {row['p50_ms']:>8.2f} {row['p95_ms']:>8.2f} "
                     f"{row['p50_ms'] - base:>+10.2f} {'-' if cpu != cpu else f'{cpu:.2f}':>19}")
    return lines


def run_gateway_bench(calls: int = 300, json_path: Path | None = None, echo: Any = print) -> list[dict[str, Any]]:
    echo(f"uni-agent bench --gateway: {os.cpu_count()} CPUs, load average {load_average():.2f}; {calls} sequential "
         "chat calls per path to a fixed-answer endpoint (its own process, no delay)")
    engine = subprocess.Popen([sys.executable, "-c", ENGINE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(engine.stdout.readline())  # type: ignore[union-attr]
        rows = asyncio.run(measure(f"http://127.0.0.1:{port}/v1", calls))
    finally:
        engine.communicate("", timeout=30)
    for line in table(rows):
        echo(line)
    if json_path is not None:
        json_path.write_text(json.dumps(rows, indent=1))
    return rows
