"""How much a stand-in model endpoint adds to each call: the thread-per-connection ScriptedLLM process
(bench/endpoint.py) against the asyncio endpoint (bench/endpoint_pool.py, one process), driven by the same client.

The rollout bench's rows put a model call's wait past its delay on the framework's side, so the stand-in's own lag
must stay small next to it. `in_flight` clients, each making `calls` calls one after another, answered after
`delay_s`; the endpoints take turns, `rounds` times each, in one invocation:

    python -m uni_agent.bench.endpoint_lag --in-flight 256 --calls 9 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import aiohttp

from .endpoint import EndpointProcess
from .endpoint_pool import EndpointPool

# A mid-rollout request's shape: a system prompt, a user message, one tool.
REQUEST = {"model": "scripted",
           "messages": [{"role": "system", "content": "You are a careful engineer. " * 80},
                        {"role": "user", "content": "Fix the failing test."}],
           "tools": [{"type": "function", "function": {"name": "execute_bash", "parameters": {
               "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]}
KINDS = ("threaded", "asyncio")


async def drive(base_url: str, in_flight: int, calls: int, delay_s: float) -> list[float]:
    """Every call's seconds past `delay_s`."""
    late: list[float] = []

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in range(calls):
            started = time.monotonic()
            async with session.post(f"{base_url}/chat/completions", json=REQUEST) as reply:
                await reply.read()
                if reply.status != 200:
                    raise RuntimeError(f"the endpoint answered {reply.status}")
            late.append(time.monotonic() - started - delay_s)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(in_flight)))
    return late


def measure(kind: str, in_flight: int, calls: int, delay_s: float) -> dict[str, Any]:
    endpoint = (EndpointProcess(delay_s, calls, "true") if kind == "threaded"
                else EndpointPool(1, delay_s, calls, "true"))
    with endpoint:
        late = sorted(asyncio.run(drive(endpoint.base_url, in_flight, calls, delay_s)))
    return {"endpoint": kind, "calls": len(late), "late_mean_ms": 1000 * statistics.fmean(late),
            "late_p50_ms": 1000 * late[len(late) // 2], "late_p95_ms": 1000 * late[int(len(late) * 0.95)],
            "late_max_ms": 1000 * late[-1], "endpoint_cpu_s": endpoint.stats.get("cpu_s", float("nan"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.endpoint_lag")
    parser.add_argument("--in-flight", type=int, default=256)
    parser.add_argument("--calls", type=int, default=9, help="calls per client, one after another")
    parser.add_argument("--delay-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=2, help="each endpoint measured this many times, in turns")
    args = parser.parse_args(argv)
    print(f"endpoint lag: {args.in_flight} clients x {args.calls} calls, answered after {args.delay_s:g} s; "
          "one aiohttp client process; ms past the delay")
    print(f"{'endpoint':>9} | {'round':>5} | {'mean':>6} | {'p50':>6} | {'p95':>6} | {'max':>6} | endpoint CPU s")
    for round_ in range(1, args.rounds + 1):
        for kind in KINDS:
            f = measure(kind, args.in_flight, args.calls, args.delay_s)
            print(f"{kind:>9} | {round_:>5} | {f['late_mean_ms']:6.1f} | {f['late_p50_ms']:6.1f} | "
                  f"{f['late_p95_ms']:6.1f} | {f['late_max_ms']:6.1f} | {f['endpoint_cpu_s']:.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
