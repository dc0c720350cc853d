"""What the JSON tool-call grammar costs, alone: one llama-server with 64 slots, N concurrent requests of an agent's
first prompt, without and with the schema the agent sends (constrain_tool_calls), after a warm-up that fills the
slots' prompt caches. Prints generation tokens/s of both, side by side:

    python cluster/grammar_bench.py LLAMA_SERVER MODEL.gguf LABEL [server args...]   # CONCS=1,64 by default
    python cluster/grammar_bench.py ~/.cache/uni-agent/llama.cpp/0.3.36-cuda/bin/llama-server m.gguf gpu -ngl 999
"""
import asyncio
import os
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from uni_agent.tool_calls import tool_call_json_schema, tool_format_instructions
from uni_agent.tools.toolbox import tool_schemas

binary, model, label = sys.argv[1], sys.argv[2], sys.argv[3]
extra = sys.argv[4:]
schemas = tool_schemas(["str_replace_editor", "execute_bash", "submit"])
msgs = [{"role": "system", "content": "You are a coding agent.\n\n" + tool_format_instructions(schemas, "hermes")},
        {"role": "user", "content": "Fix the bug in calc.py: add() returns a-b instead of a+b. The repo is in /testbed."}]
URL = "http://127.0.0.1:8931/v1/chat/completions"

def body(kind, max_tokens):
    b = {"model": "m", "messages": msgs, "max_tokens": max_tokens, "temperature": 0.8, "top_p": 0.9}
    if kind == "schema":
        b["response_format"] = {"type": "json_object", "schema": tool_call_json_schema(schemas)}
    return b

async def main():
    async with httpx.AsyncClient(timeout=600) as http:
        for i in range(240):
            try:
                if (await http.get("http://127.0.0.1:8931/health")).status_code == 200: break
            except httpx.HTTPError: pass
            await asyncio.sleep(0.5)
        for conc in [int(c) for c in os.environ.get("CONCS", "1,64").split(",")]:
            t0 = time.monotonic()
            await asyncio.gather(*(http.post(URL, json=body("none", 1)) for _ in range(conc)))
            print(f"{label} conc={conc} warm-up (prompts) {time.monotonic() - t0:.1f}s", flush=True)
            for kind in ("none", "schema"):
                t0 = time.monotonic()
                rs = await asyncio.gather(*(http.post(URL, json=body(kind, 128)) for _ in range(conc)))
                wall = time.monotonic() - t0
                t = [r.json()["timings"] for r in rs]
                n = sum(x["predicted_n"] for x in t)
                per = sorted(x["predicted_per_second"] for x in t)
                print(f"{label} conc={conc} {kind:6s}: {n} tokens in {wall:.2f}s = {n / wall:.0f} tok/s; per request "
                      f"{per[0]:.0f}-{per[-1]:.0f} tok/s (median {per[len(per) // 2]:.0f})", flush=True)

env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
proc = subprocess.Popen([binary, "--model", model, "--alias", "m", "--host", "127.0.0.1", "--port", "8931",
                         "--parallel", "64", "--ctx-size", str(64 * 4096), "--cont-batching", "--jinja",
                         "--no-webui", *extra], stdout=open(f"/tmp/gram-{label}.log", "wb"), stderr=subprocess.STDOUT, env=env)
try:
    asyncio.run(main())
finally:
    proc.terminate(); proc.wait()
