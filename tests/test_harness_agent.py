"""The harness agent end to end in one process: a real local sandbox (bubblewrap, network off), the real gateway and
relay, the real ChatClient, and the scripted endpoint (a real HTTP server, uni_agent.testing.scripted_llm) as the
model. The program is our own stdlib example (examples/harness/agent.py, mounted read-only) or a shell command.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import assistant_turns
from test_sandbox_local import processes_with

from uni_agent.config import AgentConfig
from uni_agent.episode.rollout import RolloutResult, RolloutSpec
from uni_agent.episode.envelope import run_episode
from uni_agent.harness import HarnessAgent
from uni_agent.harness.gateway import Gateway
from uni_agent.llm import ChatClient
from uni_agent.tasks.swe_form import BUNDLED_DIR
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "harness"
TASK = "uni-agent__romanum-4"
REAL_KEY = "sk-the-real-key-0123456789"


def agent_config(command: str = "python3 /opt/example/agent.py", **harness: Any) -> AgentConfig:
    return AgentConfig.model_validate({
        "name": "harness", "_target_": "uni_agent.harness.HarnessAgent",
        "env": {"deployment": {"type": "local", "repo": f"bundled:{TASK}"}},
        "harness": {"command": command, "mounts": {"/opt/example": str(EXAMPLE)}, **harness},
    })


def spec(agent: AgentConfig) -> RolloutSpec:
    instance = json.loads((BUNDLED_DIR / TASK / "instance.json").read_text())
    return RolloutSpec(run_id="run", instance_id=TASK, rollout=0, data_source="local", row_index=0,
                       prompt=[{"role": "system", "content": "ignored by harnesses"},
                               {"role": "user", "content": instance["problem_statement"]}], agent=agent)


def run_harness(policy: Callable[[dict[str, Any]], Any], agent: AgentConfig) -> tuple[RolloutResult, ScriptedLLM]:
    async def main() -> RolloutResult:
        client = ChatClient(engine.base_url, "scripted", REAL_KEY, max_attempts=1)
        gateway = await Gateway().start()
        try:
            return await run_episode(HarnessAgent(agent, gateway=gateway), spec(agent), client, worker="w")
        finally:
            await gateway.close()
            await client.aclose()

    with ScriptedLLM(policy) as engine:
        return asyncio.run(main()), engine


def solver(body: dict[str, Any]) -> dict[str, Any]:
    """Applies the task's gold patch through the example's `bash` tool, then submits."""
    patch = json.loads((BUNDLED_DIR / TASK / "instance.json").read_text())["patch"]
    turn = assistant_turns(body)
    if turn == 0:
        return tool_call_message("bash", {"command": "git status --short && ls"})
    if turn == 1:
        return tool_call_message("bash", {"command": f"cat > /tmp/fix.diff <<'EOF'\n{patch}EOF\ngit apply /tmp/fix.diff"})
    return tool_call_message("submit", {})


def test_the_example_program_solves_a_task_through_the_gateway() -> None:
    result, engine = run_harness(solver, agent_config())
    assert result.exit_reason == "submitted" and result.error is None, result.error
    assert "diff --git" in result.patch and result.num_turns == 3 == engine.num_requests
    harness = result.harness
    assert harness["exit_code"] == 0 and "submitted" in harness["output_tail"] and harness["calls"] == 3
    messages = result.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert "[exit code: 0]" in messages[5]["content"]
    assert [c["calls"] for c in result.chains] == [3]
    assert result.failure_kind == "none" and result.sandbox_start_s > 0


def test_the_run_s_key_never_enters_the_sandbox() -> None:
    """The program sees its rollout's token as OPENAI_API_KEY; the run's key is nowhere in the sandbox (every
    process's environment, the harness's files), yet the engine got it with every call."""
    look = ("env | grep -E '^OPENAI_(API_KEY|BASE_URL)='; "
            f"grep -rlsa -- '{REAL_KEY}' /proc/[0-9]*/environ /run/uni-agent /tmp /testbed; "
            "python3 /opt/example/agent.py")
    result, engine = run_harness(lambda body: tool_call_message("submit", {}), agent_config(look))
    tail = result.harness["output_tail"]
    assert "OPENAI_API_KEY=ua-" in tail and "OPENAI_BASE_URL=http://127.0.0.1:" in tail
    assert REAL_KEY not in tail and result.exit_reason == "submitted", tail
    assert engine.requests[0]["_headers"]["Authorization"] == f"Bearer {REAL_KEY}"


def test_a_program_that_never_exits_is_ended_at_its_wall_clock() -> None:
    marker = f"31{int(time.time()) % 1000}.7"
    started = time.monotonic()
    result, _ = run_harness(solver, agent_config(f"sleep {marker}; echo never", timeout=3))
    assert result.exit_reason == "wall_clock" and time.monotonic() - started < 20
    harness = result.harness
    assert harness["timed_out"] and harness["exit_code"] is None
    assert result.failure_kind == "model" and result.failure_cause == "wall_clock"
    assert processes_with(f"sleep\0{marker}".encode()) == []  # the sandbox is closed and nothing of it runs


def test_a_crash_is_a_row_with_its_exit_code_and_output_tail() -> None:
    result, _ = run_harness(solver, agent_config("echo working; echo 'Traceback: boom' >&2; exit 3"))
    assert result.exit_reason == "program_failed" and "code 3" in result.error
    harness = result.harness
    assert harness["exit_code"] == 3 and "Traceback: boom" in harness["output_tail"]
    assert result.failure_kind == "model"


def test_a_command_that_cannot_run_is_an_infrastructure_failure() -> None:
    result, _ = run_harness(solver, agent_config("/opt/example/no-such-program"))
    assert result.exit_reason == "error" and result.failure_kind == "infra"
    assert result.failure_cause.startswith("harness: ") and "127" in result.failure_cause


def test_a_call_over_the_budget_gets_an_error_and_ends_the_episode() -> None:
    """The example never submits; its third call is refused (HTTP 403), it exits, the episode is max_turns."""
    result, engine = run_harness(lambda body: tool_call_message("bash", {"command": "echo step"}),
                                 agent_config(max_calls=2))
    assert result.exit_reason == "max_turns" and engine.num_requests == 2 and result.num_turns == 2
    harness = result.harness
    assert harness["refused_calls"] == 1 and "HTTP 403" in harness["output_tail"] and harness["exit_code"] == 2


def test_a_program_that_ignores_the_end_is_stopped_after_its_grace() -> None:
    """A budget refusal the program does not act on: it is killed end_grace_s later, not at its wall clock."""
    keep_calling = ("while true; do curl -s -o /dev/null \"$OPENAI_BASE_URL/chat/completions\" "
                    "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
                    "-d '{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}'; sleep 0.2; done")
    started = time.monotonic()
    result, engine = run_harness(lambda body: {"role": "assistant", "content": "ok"},
                                 agent_config(keep_calling, max_calls=1, end_grace_s=1, timeout=60))
    assert result.exit_reason == "max_turns" and time.monotonic() - started < 30
    assert result.harness["stopped"] and engine.num_requests == 1


def test_a_program_that_cuts_its_history_yields_two_chains() -> None:
    calls: list[int] = []

    def policy(body: dict[str, Any]) -> dict[str, Any]:
        calls.append(len(body["messages"]))
        return tool_call_message("submit", {}) if len(calls) == 4 else tool_call_message("bash", {"command": "true"})

    result, _ = run_harness(policy, agent_config("python3 /opt/example/agent.py --keep-last 2"))
    chains = result.chains
    assert calls == [2, 4, 4, 4] and result.exit_reason == "submitted"
    assert [(c["first_call"], c["calls"]) for c in chains] == [(1, 2), (3, 1), (4, 1)]
    assert chains[1]["reason"].startswith("history rewritten: message 2 (assistant)")


@pytest.mark.parametrize("field", ["timeout", "max_calls"])
def test_row_overrides_reach_the_harness(field: str) -> None:
    """Per-row overrides come through tools_kwargs as for every agent: the merged config carries them."""
    from uni_agent.config import AgentConfigs

    configs = AgentConfigs({"h": agent_config().model_dump(by_alias=True, exclude_none=True)}, "test")
    merged = configs.for_row("h", {"harness": {field: 7}}, "row 0")
    assert getattr(merged.harness, field) == 7 and merged.harness.command == "python3 /opt/example/agent.py"
