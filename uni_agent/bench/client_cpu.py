"""The LLM client alone: CPU of the calling process per chat request, at a given number in flight.

It uses only `ChatClient(base_url, model).chat(messages, tools)` and `aclose()`, so the same file measures an older checkout
(`uni-agent bench --client-only --baseline REF` runs it against a worktree of REF and against this tree in one
invocation). The request is a mid-rollout turn (11.7 KB of JSON with the tool schemas); the endpoint is a ScriptedLLM
in its own process (its CPU is not counted) that keeps connections open, as engines do, and answers after a short
delay; the figure is `time.process_time()` of this process over the requests, divided by their number. Run as a
script it prints one JSON object: `python -m uni_agent.bench.client_cpu --requests 2000 --in-flight 100`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from typing import Any

# A mid-rollout request as our agent sends it: system prompt, task, 8 turns of tool calls and their outputs, and the
# tool schemas (the whole conversation goes out again at every turn, so encoding it is part of each call's cost).
_ARGUMENTS = '{"command": "grep -rn \\"def parse\\" src/ | head -20"}'
PROMPT = [{"role": "system", "content": "You are a coding agent. " * 80},
          {"role": "user", "content": "Fix the failing test in the repository. " * 12}]
for _turn in range(8):
    PROMPT.append({"role": "assistant", "content": "Let me look at the parser first. " * 3, "tool_calls": [
        {"id": f"call_{_turn}", "type": "function", "function": {"name": "execute_bash", "arguments": _ARGUMENTS}}]})
    PROMPT.append({"role": "tool", "tool_call_id": f"call_{_turn}",
                   "content": "src/parse.py:12:def parse(text):\nsrc/parse.py:40:def parse_line(line):\n" * 6})
TOOLS = [{"type": "function", "function": {
    "name": name, "description": f"The {name} tool: " + "what it does and when to use it. " * 12,
    "parameters": {"type": "object", "properties": {
        arg: {"type": "string", "description": f"the {arg}, " + "described at length. " * 4} for arg in args},
        "required": list(args[:1])}}}
    for name, args in (("execute_bash", ("command",)), ("submit", ()),
                       ("str_replace_editor", ("command", "path", "file_text", "old_str", "new_str", "view_range")))]


def _serve(port_out: Any, stop: Any, delay_s: float) -> None:
    from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

    # keep_alive: every engine we run (llama-server, vLLM) keeps connections open; a connect per request is not a cost
    # the rollouts pay
    with ScriptedLLM(lambda body: tool_call_message("execute_bash", {"command": "ls"}), delay_s=delay_s,
                     keep_requests=False, keep_alive=True) as server:
        port_out.put(server.base_url)
        stop.wait()


async def measure(base_url: str, requests: int, in_flight: int) -> dict[str, Any]:
    from uni_agent.llm import ChatClient

    client = ChatClient(base_url, "scripted")
    gate = asyncio.Semaphore(in_flight)

    async def one() -> None:
        async with gate:
            await client.chat(PROMPT, tools=TOOLS)

    try:
        await asyncio.gather(*(one() for _ in range(min(50, requests))))  # warm up: connections, imports
        cpu, wall = time.process_time(), time.monotonic()
        await asyncio.gather(*(one() for _ in range(requests)))
        cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    finally:
        await client.aclose()
    return {"requests": requests, "in_flight": in_flight, "client_cpu_ms_per_request": round(1000 * cpu / requests, 3),
            "wall_s": round(wall, 2)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.client_cpu")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--in-flight", type=int, default=100)
    parser.add_argument("--delay-s", type=float, default=0.05, help="the endpoint's delay per answer")
    args = parser.parse_args(argv)
    context = multiprocessing.get_context("spawn")
    port_out, stop = context.Queue(), context.Event()
    server = context.Process(target=_serve, args=(port_out, stop, args.delay_s), daemon=True)
    server.start()
    try:
        figures = asyncio.run(measure(port_out.get(timeout=60), args.requests, args.in_flight))
    finally:
        stop.set()
        server.join(10)
    json.dump(figures, sys.stdout)
    print()


if __name__ == "__main__":
    main()
