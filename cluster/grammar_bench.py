"""What the JSON tool-call grammar costs, alone: one llama-server with 64 slots, N concurrent requests of an agent's
first prompt, without and with the schema the agent sends (constrain_tool_calls), after a warm-up that fills the
slots' prompt caches. Prints generation tokens/s of both, side by side:

    python cluster/grammar_bench.py LLAMA_SERVER MODEL.gguf LABEL [server args...]   # CONCS=1,64 by default
    python cluster/grammar_bench.py ~/.cache/uni-agent/llama.cpp/0.3.36-cuda-*/bin/llama-server m.gguf gpu -ngl 999

cluster/build_bench.py uses `serve` and `measure` to compare the decoding speed of two builds of the server.
"""
import asyncio
import os
import secrets
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from uni_agent.tool_calls import tool_call_json_schema, tool_format_instructions
from uni_agent.tools.toolbox import tool_schemas

# Every server these scripts start answers only their own requests (LLAMA_API_KEY, never on the command line, as the
# engine does): on a shared node another user could otherwise use it, and skew the figures too. /health stays open.
API_KEY = secrets.token_urlsafe(32)
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SCHEMAS = tool_schemas(["str_replace_editor", "execute_bash", "submit"])
MESSAGES = [{"role": "system", "content": "You are a coding agent.\n\n" + tool_format_instructions(SCHEMAS, "hermes")},
            {"role": "user",
             "content": "Fix the bug in calc.py: add() returns a-b instead of a+b. The repo is in /testbed."}]


def body(kind, max_tokens):
    b = {"model": "m", "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.8, "top_p": 0.9}
    if kind == "schema":
        b["response_format"] = {"type": "json_object", "schema": tool_call_json_schema(SCHEMAS)}
    return b


def serve(binary, model, log_path, *, port=8931, slots=64, extra=(), cores=None):
    """A llama-server on 127.0.0.1:port (pinned to `cores` when given); the caller terminates it."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "LLAMA_API_KEY": API_KEY}
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    return subprocess.Popen([binary, "--model", model, "--alias", "m", "--host", "127.0.0.1", "--port", str(port),
                             "--parallel", str(slots), "--ctx-size", str(slots * 4096), "--cont-batching", "--jinja",
                             "--no-webui", *extra], stdout=open(log_path, "wb"), stderr=subprocess.STDOUT, env=env,
                            preexec_fn=pin)


def cpu_seconds(pid):
    """User + system CPU time of a process so far (0 where /proc cannot tell)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_healthy(http, port, timeout, interval=0.5):
    """Polls the llama-server on 127.0.0.1:port until its /health answers 200 or `timeout` seconds pass; says which."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if (await http.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(interval)


async def measure(label, *, port=8931, concs=(1, 64), kinds=("none", "schema"), max_tokens=128, pid=None):
    """Waits for the server, then per concurrency: a warm-up, and each kind's generation. Returns one dict a row.
    With the server's pid, each row also has the server's CPU seconds: on shared cores, tokens per CPU second
    varies far less than tokens per second of wall time."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    rows = []
    async with httpx.AsyncClient(timeout=600, headers=AUTH) as http:
        await wait_healthy(http, port, 120)  # measured either way: a server that never came up fails the requests
        for conc in concs:
            t0, cpu0 = time.monotonic(), cpu_seconds(pid) if pid else 0.0
            rs = await asyncio.gather(*(http.post(url, json=body("none", 1)) for _ in range(conc)))
            wall, cpu = time.monotonic() - t0, cpu_seconds(pid) - cpu0 if pid else 0.0
            n = sum(r.json()["timings"]["prompt_n"] for r in rs)
            rows.append({"label": label, "conc": conc, "kind": "prompts", "tokens": n, "wall_s": wall,
                         "tokens_per_s": n / wall, "server_cpu_s": cpu, "tokens_per_cpu_s": n / cpu if cpu else None})
            print(f"{label} conc={conc} warm-up (prompts): {n} prompt tokens in {wall:.1f}s", flush=True)
            for kind in kinds:
                t0, cpu0 = time.monotonic(), cpu_seconds(pid) if pid else 0.0
                rs = await asyncio.gather(*(http.post(url, json=body(kind, max_tokens)) for _ in range(conc)))
                wall = time.monotonic() - t0
                cpu = cpu_seconds(pid) - cpu0 if pid else 0.0
                t = [r.json()["timings"] for r in rs]
                n = sum(x["predicted_n"] for x in t)
                per = sorted(x["predicted_per_second"] for x in t)
                rows.append({"label": label, "conc": conc, "kind": kind, "tokens": n, "wall_s": wall,
                             "tokens_per_s": n / wall, "per_request_median": per[len(per) // 2], "server_cpu_s": cpu,
                             "tokens_per_cpu_s": n / cpu if cpu else None})
                per_cpu = f"; {n / cpu:.0f} tokens per server CPU second" if cpu else ""
                print(f"{label} conc={conc} {kind:6s}: {n} tokens in {wall:.2f}s = {n / wall:.0f} tok/s; per request "
                      f"{per[0]:.0f}-{per[-1]:.0f} tok/s (median {per[len(per) // 2]:.0f}){per_cpu}", flush=True)
    return rows


if __name__ == "__main__":
    binary, model, label = sys.argv[1], sys.argv[2], sys.argv[3]
    proc = serve(binary, model, f"/tmp/gram-{label}.log", extra=sys.argv[4:])
    try:
        asyncio.run(measure(label, concs=[int(c) for c in os.environ.get("CONCS", "1,64").split(",")]))
    finally:
        proc.terminate()
        proc.wait()
