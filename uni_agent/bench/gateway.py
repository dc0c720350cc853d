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

from ..harness.gateway import Gateway, Lease
from ..llm import ChatClient
from ..sandbox.local import LocalDeploymentConfig
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
        async with LocalDeploymentConfig(repo=str(repo)).build({}, "bench-gateway") as box:
            port = await box.session.listen(await gateway.door(lease))  # type: ignore[attr-defined]
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


# -- the rollout sweep: a harness program as the agent next to our loop ----------------------------------------------

# A thin harness: mini-swe-agent's protocol (one `bash` tool; done when a command prints its submit line) in the
# standard library, so that the sweep shows the harness path's own cost next to a real program's.
THIN = r"""
import json, os, subprocess, urllib.request
tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object",
         "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
messages = [{"role": "system", "content": "Run commands."}, {"role": "user", "content": open(os.environ["UNI_AGENT_PROMPT_FILE"]).read()}]
while True:
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps({"messages": messages, "tools": tools}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    reply = json.load(urllib.request.urlopen(request))["choices"][0]["message"]
    messages.append(reply)
    for call in reply.get("tool_calls") or []:
        out = subprocess.run(json.loads(call["function"]["arguments"])["command"], shell=True, capture_output=True,
                             text=True).stdout
        if out.startswith("COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"):
            raise SystemExit(0)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out})
"""


def harness_agents(concurrency: int, turns: int, program: str, scratch: Path):
    """The bench workload for a harness: mini-swe-agent (its shipped config on the prepared venv) or the thin program;
    structured tool calls from the scripted endpoint (a `bash` tool, then mini's submit command)."""
    import yaml

    from ..config import AgentConfigs
    from ..harness.prepare import prepare
    from ..settings import REPO_ROOT

    if program == "mini-swe-agent":
        entry = yaml.safe_load((REPO_ROOT / "examples" / "harness" / "mini_swe_agent.yaml").read_text())[0]
        entry["harness"]["mounts"] = {"/opt/mini-swe-agent": str(prepare("mini-swe-agent"))}
    else:
        (scratch / "thin").mkdir(parents=True, exist_ok=True)
        (scratch / "thin" / "thin.py").write_text(THIN)
        entry = {"name": "swe_agent", "_target_": "uni_agent.harness.HarnessAgent",
                 "harness": {"command": "python3 /opt/thin/thin.py", "mounts": {"/opt/thin": str(scratch / "thin")}}}
    entry.update(concurrency=concurrency, interaction={"max_turns": turns + 2, "tools_in": "api",
                                                       "episode_timeout": 3600})
    entry.setdefault("env", {})["deployment"] = {"type": "local", "deployment_timeout": 3600}
    return AgentConfigs({entry["name"]: entry}, f"bench harness {program}")


def sweep_point(system: str, base_url: str, *, concurrency: int, turns: int, rollouts: int, out_dir: Path
                ) -> dict[str, Any]:
    """One run of `rollouts` rollouts at `concurrency` on one agent worker: rollouts/min and CPU per model call."""
    import logging

    import dask
    from distributed import Client, LocalCluster

    from ..driver.cluster import local_cluster_config, local_cluster_options
    from ..driver.run import run
    from ..sandbox.repo import prepare_base_repo, resolve_repo
    from .measure import Cpu, machine_cpu_seconds
    from .ours import TASK, bench_agents, bench_rows

    agents = bench_agents(concurrency, turns) if system == "our loop" else harness_agents(concurrency, turns, system, out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = bench_rows(out_dir.parent)
    prepare_base_repo(resolve_repo(f"bundled:{TASK}"))
    # a run's cluster (TLS: a scheduler without it runs what any local user sends it, as this user), no pages
    with dask.config.set(local_cluster_config()), \
            LocalCluster(**local_cluster_options(1, 2, None), silence_logs=logging.ERROR) as cluster, \
            Client(cluster) as client:
        before_workers, before_driver, machine_before = client.run(cpu_now), cpu_now(), machine_cpu_seconds()
        started = time.monotonic()
        results = run(rows, agents, client=client, engine="external", base_url=base_url, model_name="scripted",
                      n=rollouts, agent_workers=1, verify=False, progress=False, output_dir=str(out_dir)).results
        makespan = time.monotonic() - started
        machine = machine_cpu_seconds() - machine_before
        workers = sum((cpu - before_workers[a] for a, cpu in client.run(cpu_now).items()), Cpu())
        driver = cpu_now() - before_driver
    calls = max(1, int(results["num_turns"].sum()))
    return {"system": system, "concurrency": concurrency, "rollouts": rollouts,
            "ok": int((results["exit_reason"] == "submitted").sum()), "llm_calls": calls,
            "rollouts_per_min": rollouts / makespan * 60, "makespan_s": makespan,
            "framework_cpu_ms_per_turn": (workers.own + driver.own) / calls * 1000,
            "sandbox_cpu_ms_per_turn": workers.children / calls * 1000,
            "machine_cpu_ms_per_turn": machine / calls * 1000,
            "errors": sorted({str(e)[:200] for e in results["error"].dropna()})[:2]}


def run_harness_sweep(concurrency: list[int], rollouts_per_slot: int = 2, turns: int = 4, delay_s: float = 0.5,
                      systems: tuple[str, ...] = ("our loop", "thin program", "mini-swe-agent"), echo: Any = print
                      ) -> list[dict[str, Any]]:
    """Our loop, a thin stdlib harness and mini-swe-agent on the same workload, one after another at each concurrency: `turns` commands
    (`echo hello && ls`) then the end, the endpoint answering after `delay_s`."""
    from .endpoint import EndpointProcess

    echo(f"uni-agent bench --gateway-sweep: {os.cpu_count()} CPUs, load average {load_average():.2f}; {turns} "
         f"commands + submit per rollout, endpoint delay {delay_s:g} s, one agent worker; framework = driver + "
         "worker CPU (the gateway's included), sandbox = what the worker reaped (little: bwrap's pid namespace keeps "
         "the program's CPU from it), machine = /proc/stat, everything (the harness program's own CPU included)")
    echo(f"{'system':<16} {'conc':>5} {'ok':>7} {'rollouts/min':>13} {'framework ms/turn':>18} "
         f"{'sandbox ms/turn':>16} {'machine ms/turn':>16}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="uni-agent-bench-harness-") as tmp, \
            EndpointProcess(delay_s=delay_s, turns=turns, command="echo hello && ls") as endpoint:
        for c in concurrency:
            for system in systems:
                row = sweep_point(system, endpoint.base_url, concurrency=c, turns=turns,
                                  rollouts=c * rollouts_per_slot, out_dir=Path(tmp) / f"{system}-{c}".replace(" ", "-"))
                rows.append(row)
                echo(f"{system:<16} {c:>5} {row['ok']:>3}/{row['rollouts']:<3} {row['rollouts_per_min']:>13.1f} "
                     f"{row['framework_cpu_ms_per_turn']:>18.1f} {row['sandbox_cpu_ms_per_turn']:>16.1f} "
                     f"{row['machine_cpu_ms_per_turn']:>16.1f}" + (f"  {row['errors']}" if row["errors"] else ""))
    return rows
