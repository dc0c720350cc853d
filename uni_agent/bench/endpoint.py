"""The benchmark's LLM endpoint: a ScriptedLLM in its own process that answers every turn after a fixed delay.

Each rollout gets `turns` replies that run `command`, then one that ends the episode, in the format of whichever
agent asks: uni-agent's `execute_bash` / `submit` tool calls, or mini-swe-agent's `bash` tool call (it ends with its
submit command, `echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`). Keep-alive connections, as vLLM offers them.

It runs in a separate process so that its CPU time is not counted as the framework's:

    python -m uni_agent.bench.endpoint --delay-s 2 --turns 8 --command 'echo hi && ls'
    # prints {"base_url": ...} on stdout, serves until stdin closes, then prints {"requests": N, "cpu_s": ...}
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from typing import Any

from ..testing.scripted_llm import ScriptedLLM, tool_call_message
from .lifetime import die_with_bench

MINI_SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class BenchPolicy:
    def __init__(self, turns: int, command: str):
        self.turns, self.command = turns, command

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]:
        done = sum(m.get("role") == "assistant" for m in body["messages"])
        tools = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        if "bash" in tools:  # mini-swe-agent's single tool
            command = self.command if done < self.turns else MINI_SUBMIT
            return tool_call_message("bash", {"command": command}, content="THOUGHT: next step.")
        if done < self.turns:
            return tool_call_message("execute_bash", {"command": self.command})
        return tool_call_message("submit", {})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m uni_agent.bench.endpoint")
    parser.add_argument("--delay-s", type=float, required=True)
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--command", required=True)
    args = parser.parse_args(argv)
    server = ScriptedLLM(BenchPolicy(args.turns, args.command), delay_s=args.delay_s, keep_requests=False,
                         keep_alive=True)
    with server:
        print(json.dumps({"base_url": server.base_url}), flush=True)
        sys.stdin.read()  # until the bench closes our stdin
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"requests": server.num_requests, "cpu_s": usage.ru_utime + usage.ru_stime}), flush=True)
    return 0


class EndpointProcess:
    """`with EndpointProcess(...) as ep: ep.base_url`; `ep.stats` after exit."""

    def __init__(self, delay_s: float, turns: int, command: str):
        self.argv = [sys.executable, "-m", "uni_agent.bench.endpoint", "--delay-s", str(delay_s),
                     "--turns", str(turns), "--command", command]
        self.stats: dict[str, Any] = {}

    def __enter__(self) -> EndpointProcess:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     preexec_fn=die_with_bench())
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            self.proc.kill()
            raise RuntimeError("the benchmark endpoint did not start")
        self.base_url = json.loads(line)["base_url"]
        self.pid = self.proc.pid
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            out, _ = self.proc.communicate(input="", timeout=30)
            self.stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
