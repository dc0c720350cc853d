"""How many llama-servers one GPU should run: 1, 2, 4 and 8 servers side by side on one GPU, the same 64 slots split
among them (as `engine_servers_per_gpu` splits `engine_parallel`), each started with the engine's own command line
(uni_agent.engines.llama_cpp.server_command). Per layout, without and with the agent's JSON tool-call grammar:
64 concurrent requests of an agent's first prompt (spread over the servers as the client spreads them), after a
warm-up that fills every slot's prompt cache; `--rounds` rounds. Prints one table, completion tokens/s of all
servers, per-request tokens/s and request latency, and writes JSON with `--json`.

    python cluster/servers_per_gpu.py LLAMA_SERVER MODEL.gguf [--servers 1,2,4,8] [--slots 64] [--json out.json]

Run it on the GPU machine (DEVELOPERS.md says how a llama-server gets built there).
"""
import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time

import httpx

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the agent's first prompt (with or without the schema), and the wait for a server's /health
from cluster.grammar_bench import API_KEY, AUTH, body, wait_healthy  # noqa: E402
from uni_agent.engines.llama_cpp import server_command, slots_per_server  # noqa: E402

BASE_PORT = 8941
CONTEXT = 4096
THREADS = 4  # the engine's default for a GPU server


def start_servers(binary: str, model: str, servers: int, slots: int, log_dir: str) -> list[subprocess.Popen]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "LLAMA_API_KEY": API_KEY}  # their requests only
    procs = []
    for i in range(servers):
        argv = server_command(binary, model, "m", host="127.0.0.1", port=BASE_PORT + i,
                              slots=slots_per_server(slots, servers), context_length=CONTEXT, threads=THREADS,
                              gpu=True)
        with open(os.path.join(log_dir, f"server-{servers}-{i}.log"), "wb") as log:  # the child keeps its copy
            procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env))
    return procs


async def wait_all_healthy(http: httpx.AsyncClient, servers: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    for i in range(servers):
        if not await wait_healthy(http, BASE_PORT + i, deadline - time.monotonic(), interval=0.3):
            raise RuntimeError(f"server {i} of {servers} not healthy after {timeout:g}s")


async def one_round(http: httpx.AsyncClient, servers: int, requests: int, kind: str, max_tokens: int) -> dict:
    async def request(i: int) -> tuple[dict, float]:
        started = time.monotonic()
        reply = await http.post(f"http://127.0.0.1:{BASE_PORT + i % servers}/v1/chat/completions",
                                json=body(kind, max_tokens))
        reply.raise_for_status()
        return reply.json()["timings"], time.monotonic() - started

    started = time.monotonic()
    done = await asyncio.gather(*(request(i) for i in range(requests)))
    wall = time.monotonic() - started
    tokens = sum(t["predicted_n"] for t, _ in done)
    return {"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
            "per_request_tokens_per_s": statistics.median(t["predicted_per_second"] for t, _ in done),
            "latency_p50_s": statistics.median(s for _, s in done), "latency_max_s": max(s for _, s in done)}


async def measure_layout(binary: str, model: str, servers: int, args) -> list[dict]:
    procs = start_servers(binary, model, servers, args.slots, args.log_dir)
    rows = []
    try:
        async with httpx.AsyncClient(timeout=600, headers=AUTH,
                                     limits=httpx.Limits(max_connections=args.requests * 2)) as http:
            await wait_all_healthy(http, servers)
            await one_round(http, servers, args.requests, "none", 1)  # warm-up: every slot reads the prompt once
            for kind in ("none", "schema"):
                rounds = [await one_round(http, servers, args.requests, kind, args.max_tokens)
                          for _ in range(args.rounds)]
                row = {"servers": servers, "slots_each": slots_per_server(args.slots, servers),
                       "grammar": kind == "schema"}
                for key in rounds[0]:
                    row[key] = statistics.mean(r[key] for r in rounds)
                rows.append(row)
                print(f"{servers} server(s) x {row['slots_each']} slots, grammar {'on ' if row['grammar'] else 'off'}: "
                      f"{row['tokens_per_s']:7.0f} tok/s, per request {row['per_request_tokens_per_s']:5.1f} tok/s, "
                      f"latency p50 {row['latency_p50_s']:5.2f} s (max {row['latency_max_s']:.2f})", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()
    return rows


def table(rows: list[dict]) -> str:
    best = {g: max(r["tokens_per_s"] for r in rows if r["grammar"] == g) for g in (False, True)}
    lines = ["| servers x slots | grammar | tokens/s (all servers) | of the best | per request tok/s | latency p50 s |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: (r["grammar"], r["servers"])):
        lines.append(f"| {r['servers']} x {r['slots_each']} | {'on' if r['grammar'] else 'off'} | "
                     f"{r['tokens_per_s']:.0f} | {r['tokens_per_s'] / best[r['grammar']]:.2f} | "
                     f"{r['per_request_tokens_per_s']:.1f} | {r['latency_p50_s']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("binary")
    parser.add_argument("model")
    parser.add_argument("--servers", default="1,2,4,8")
    parser.add_argument("--slots", type=int, default=64, help="slots on the GPU in all, split among its servers")
    parser.add_argument("--requests", type=int, default=64, help="concurrent requests per round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--log-dir", default="/tmp/servers-per-gpu")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    os.makedirs(args.log_dir, exist_ok=True)
    rows = []
    for servers in (int(s) for s in args.servers.split(",")):
        rows += asyncio.run(measure_layout(args.binary, args.model, servers, args))
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
