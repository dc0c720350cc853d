"""The agent loop alone, fast: each way an episode ends, with a ScriptedLLM (a real OpenAI-compatible HTTP server,
uni_agent/testing/scripted_llm.py) for the model and a FakeSandbox (an in-memory test double,
uni_agent/testing/fake_sandbox.py) for the sandbox, both handed to the loop as arguments. The same endings on real
sandboxes and Dask: tests/test_run_dask.py::test_exit_reasons."""

import asyncio
import json

import pytest
import yaml

from conftest import AGENT_CONFIG, REPO_ROOT, assistant_turns
from uni_agent.episode.agent_loop import UniAgentLoop, first_request
from uni_agent.episode.envelope import run_episode
from uni_agent.config import deep_merge, validate_agent
from uni_agent.episode.exit_reason import ExitReason
from uni_agent.grading import Verification
from uni_agent.llm import ChatClient
from uni_agent.episode.rollout import RolloutSpec
from uni_agent.sandbox import SandboxStartError
from uni_agent.sandbox.start import start_sandbox
from uni_agent.testing.fake_sandbox import Answer, FakeSandbox, opener
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM, tool_call_message

PATCH = "diff --git a/x b/x\n"


def _agent(mask_abnormal_exit_traj=False, **interaction):
    """The example agent, its tools called through the API; its sandbox's repo is never opened (FakeSandbox)."""
    overrides = {"interaction": {"tools_in": "api", "constrain_tool_calls": False, "max_turns": 4, **interaction},
                 "env": {"deployment": {"repo": str(REPO_ROOT)}}, "mask_abnormal_exit_traj": mask_abnormal_exit_traj}
    (example,) = yaml.safe_load(AGENT_CONFIG.read_text())
    return validate_agent(deep_merge(example, overrides), "unit test agent")


def _spec(agent, grade_in_agent_sandbox=False):
    return RolloutSpec(run_id="unit", instance_id="task", rollout=0, data_source="unit", row_index=0,
                       prompt=[{"role": "user", "content": "Fix the bug."}], agent=agent,
                       grade_in_agent_sandbox=grade_in_agent_sandbox)


def _run(policy, sandbox, agent=None, *, spec=None, **loop_args):
    """One rollout; returns its result and the events it emitted."""
    agent = agent or _agent()
    events = []

    async def main():
        with ScriptedLLM(policy) as server:
            client = ChatClient(server.base_url, "scripted", max_attempts=1)
            try:
                return await run_episode(UniAgentLoop(agent), spec or _spec(agent), client, emit=events.append,
                                         worker="w1", **{"open_sandbox": opener(sandbox), **loop_args})
            finally:
                await client.aclose()

    return asyncio.run(main()), events


def bash(command):
    return tool_call_message("execute_bash", {"command": command})


def test_submit_ends_the_episode_as_submitted_and_keeps_the_patch():
    sandbox = FakeSandbox(lambda command: "hello", patch=PATCH)

    def policy(body):
        return bash("echo hello") if assistant_turns(body) == 0 else tool_call_message("submit", {})

    result, events = _run(policy, sandbox)
    assert result.exit_reason == ExitReason.SUBMITTED == "submitted" and result.error is None
    assert type(result.row()["exit_reason"]) is str  # a plain string for Parquet (and the events)
    assert all(type(e["state"]) is str for e in events)
    assert result.num_turns == 2 and result.patch == PATCH and result.failure_cause == "not verified"
    assert sandbox.name == "task-r0" and sandbox.closed
    assert sandbox.commands[0] == "echo hello" and "git diff --cached" in sandbox.commands[-1]
    messages = result.messages
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant", "tool"]
    assert messages[2]["content"] == "hello\n[exit code: 0]"
    assert [e["state"] for e in events] == ["starting_sandbox", "running", "running"]
    assert all(e["worker"] == "w1" for e in events)


def test_turns_run_out_as_max_turns():
    result, _ = _run(lambda body: bash("ls"), FakeSandbox(patch=PATCH), _agent(max_turns=3))
    assert result.exit_reason == ExitReason.MAX_TURNS and result.num_turns == 3 and result.error is None
    assert result.failure_kind == "model" and result.failure_cause == "max_turns"
    assert result.patch == PATCH  # the work so far is kept and can still be graded


def test_too_many_command_timeouts_end_as_command_timeouts():
    sandbox = FakeSandbox(lambda command: Answer("partial", seconds=5.0))
    result, _ = _run(lambda body: bash("sleep 5"), sandbox, _agent(action_timeout=0.05, timeout_budget=1))
    assert result.exit_reason == ExitReason.COMMAND_TIMEOUTS
    assert result.error == "more than 1 command timeouts" and result.num_turns == 2
    assert result.failure_kind == "model" and result.failure_cause == "command_timeouts"
    assert "killed because it ran longer than 0.05 seconds" in result.messages[-1]["content"]


def test_a_timeout_within_the_budget_lets_the_episode_go_on():
    sandbox = FakeSandbox(lambda command: Answer(seconds=5.0) if command == "slow" else "fast")

    def policy(body):
        turns = assistant_turns(body)
        return bash("slow") if turns == 0 else bash("quick") if turns == 1 else tool_call_message("submit", {})

    result, _ = _run(policy, sandbox, _agent(action_timeout=0.05, timeout_budget=1))
    assert result.exit_reason == ExitReason.SUBMITTED and result.num_turns == 3


def test_running_past_the_episode_timeout_ends_as_wall_clock():
    sandbox = FakeSandbox(lambda command: Answer("tick", seconds=0.1))
    agent = _agent(max_turns=1000, episode_timeout=0.5)
    result, _ = _run(lambda body: bash("step"), sandbox, agent)
    assert result.exit_reason == ExitReason.WALL_CLOCK
    assert result.error == "the episode ran past its wall-clock budget of 0.5 s"
    assert 1 <= result.num_turns < 1000 and result.failure_cause == "wall_clock"
    assert sandbox.closed


def test_a_context_window_error_ends_as_context_limit():
    fault = Fault(400, json.dumps({"error": {"message": "the request exceeds the available context size"}}))
    result, _ = _run(lambda body: bash("ls") if assistant_turns(body) == 0 else fault, FakeSandbox())
    assert result.exit_reason == ExitReason.CONTEXT_LIMIT and "context size" in result.error
    assert result.num_turns == 2 and result.failure_kind == "model"


def test_an_llm_error_ends_as_an_infra_error():
    result, _ = _run(lambda body: Fault(401, '{"error": {"message": "bad key"}}'), FakeSandbox())
    assert result.exit_reason == ExitReason.ERROR and result.error.startswith("LLMError: ") and "HTTP 401" in result.error
    assert result.failure_kind == "infra" and result.failure_cause.startswith("llm: LLMError")


def test_a_sandbox_that_does_not_open_ends_as_an_infra_error():
    async def broken(agent, name):
        raise SandboxStartError("injected: never comes up")

    agent = _agent()
    events = []

    async def main():
        return await run_episode(UniAgentLoop(agent), _spec(agent), ChatClient("http://127.0.0.1:9/v1", "none"),
                                 emit=events.append, open_sandbox=broken)

    result = asyncio.run(main())
    assert result.exit_reason == ExitReason.ERROR and result.num_turns == 0
    assert result.error == "SandboxStartError: injected: never comes up" and result.failure_cause.startswith("sandbox")


def _started_by_start_sandbox(sandbox):
    """An opener going through the real start_sandbox (its retries, and its closing of a half-started sandbox)."""
    return lambda agent, name: start_sandbox(agent, name, make=lambda *args, **kwargs: sandbox)


def test_the_first_model_call_is_made_while_the_sandbox_starts():
    sandbox = FakeSandbox(lambda command: "hello", patch=PATCH, start_s=0.6)
    started_at_call = []

    def policy(body):
        started_at_call.append(sandbox.started)
        return bash("echo hello") if assistant_turns(body) == 0 else tool_call_message("submit", {})

    result, events = _run(policy, sandbox)
    assert started_at_call == [False, True]  # the first call did not wait for the start; the tool call did
    assert result.exit_reason == ExitReason.SUBMITTED and result.num_turns == 2 and result.patch == PATCH
    assert sandbox.commands[0] == "echo hello" and sandbox.closed
    assert result.sandbox_start_s >= 0.6 and result.llm_s < 0.6  # each still times only its own part
    assert [e["state"] for e in events] == ["starting_sandbox", "running", "running"]


def test_a_failing_model_call_with_the_start_in_flight_leaves_no_sandbox():
    sandbox = FakeSandbox(start_s=2.0)
    agent = _agent()
    result, _ = _run(lambda body: Fault(401, '{"error": {"message": "bad key"}}'), sandbox, agent,
                     open_sandbox=_started_by_start_sandbox(sandbox))
    assert result.failure_kind == "infra" and result.failure_cause.startswith("llm: LLMError")
    assert not sandbox.started and sandbox.closed  # the start was cancelled and what it had begun closed
    assert result.total_s < 1.5  # the rollout did not wait for the start


def test_a_rollout_cancelled_while_its_sandbox_starts_closes_it():
    sandbox = FakeSandbox(start_s=2.0)
    agent = _agent()

    async def main():
        with ScriptedLLM(lambda body: bash("ls"), delay_s=0.1) as server:
            client = ChatClient(server.base_url, "scripted", max_attempts=1)
            rollout = asyncio.ensure_future(run_episode(UniAgentLoop(agent), _spec(agent), client,
                                                        open_sandbox=_started_by_start_sandbox(sandbox)))
            await asyncio.sleep(0.5)  # the first reply has come; the rollout waits for the start
            rollout.cancel()
            with pytest.raises(asyncio.CancelledError):
                await rollout
            await client.aclose()

    asyncio.run(main())
    assert not sandbox.started and sandbox.closed


def test_a_start_failing_during_the_first_call_ends_at_once_as_a_sandbox_error():
    async def broken(agent, name):
        await asyncio.sleep(0.1)
        raise SandboxStartError("injected: never comes up")

    agent = _agent()

    async def main():
        with ScriptedLLM(lambda body: bash("ls"), delay_s=3.0) as server:
            client = ChatClient(server.base_url, "scripted", max_attempts=1)
            try:
                return await run_episode(UniAgentLoop(agent), _spec(agent), client, open_sandbox=broken)
            finally:
                await client.aclose()

    result = asyncio.run(main())
    assert result.error == "SandboxStartError: injected: never comes up" and result.failure_cause.startswith("sandbox")
    assert result.failure_kind == "infra" and result.num_turns == 0
    assert result.total_s < 2.0  # the model call (3 s) was cancelled, not waited for


def test_the_first_request_is_what_the_loop_sends_first():
    """first_request (what an engine caches for every slot, uni_agent.engines.shared_prompt) equals the loop's own
    first model call, for tools in the request and tools described in the system prompt."""
    for agent in (_agent(), _agent(tools_in="prompt")):
        sandbox = FakeSandbox()
        seen = []
        _run(lambda body: seen.append(body) or tool_call_message("submit", {}), sandbox, agent)
        messages, tools = first_request(_spec(agent))
        assert seen[0]["messages"] == messages and seen[0].get("tools") == tools
        assert (tools is None) == (agent.interaction.tools_in == "prompt")


def test_malformed_calls_are_observations_and_no_call_gets_a_hint():
    def policy(body):
        turns = assistant_turns(body)
        if turns == 0:
            return tool_call_message("no_such_tool", {})
        if turns == 1:
            return {"role": "assistant", "content": "I think I am done."}
        return tool_call_message("submit", {})

    result, _ = _run(policy, FakeSandbox())
    messages = result.messages
    assert result.exit_reason == ExitReason.SUBMITTED and result.num_turns == 3
    assert messages[2]["role"] == "tool" and "Error in your tool call" in messages[2]["content"]
    assert messages[4]["role"] == "user" and "contained no tool call" in messages[4]["content"]


def test_grading_in_the_agent_sandbox_goes_through_the_hook_before_the_sandbox_closes():
    sandbox = FakeSandbox(patch=PATCH)
    seen = []

    async def grade(box, agent):
        seen.append((box, box.closed))
        return Verification(reward=1.0, resolved=True, status="resolved")

    agent = _agent()
    result, events = _run(lambda body: tool_call_message("submit", {}), sandbox, agent,
                          spec=_spec(agent, grade_in_agent_sandbox=True), grade_in_sandbox=grade)
    assert seen == [(sandbox, False)] and sandbox.closed
    assert result.resolved and result.reward == 1.0 and result.failure_kind == "none"
    assert events[-1]["state"] == "verifying"


def test_grading_in_the_sandbox_without_a_hook_is_refused_before_anything_starts():
    sandbox = FakeSandbox()
    agent = _agent()
    with pytest.raises(ValueError, match="no grade_in_sandbox"):
        _run(lambda body: tool_call_message("submit", {}), sandbox, agent, spec=_spec(agent, grade_in_agent_sandbox=True))
    assert not sandbox.started


def test_mask_abnormal_exit_masks_every_end_but_submit():
    agent = _agent(mask_abnormal_exit_traj=True, max_turns=2)
    result, _ = _run(lambda body: bash("ls"), FakeSandbox(), agent)
    assert result.masked and result.mask_reason == "mask_abnormal_exit_traj: exit_reason max_turns"
    submitted, _ = _run(lambda body: tool_call_message("submit", {}), FakeSandbox(), agent)
    assert not submitted.masked


def test_with_a_sandbox_closer_the_result_returns_before_the_close_and_the_worker_waits_for_it(tmp_path):
    """An agent worker hands each finished rollout's sandbox to envelope.sandbox_closer: the result (patch taken)
    comes back without waiting for the close, and the worker's own close waits for every sandbox still closing."""
    from uni_agent.episode.envelope import sandbox_closer
    from uni_agent.episode.worker import AgentWorker

    class SlowToClose(FakeSandbox):
        async def close(self):
            await asyncio.sleep(0.5)
            await super().close()

    sandbox = SlowToClose(patch=PATCH)
    agent = _agent()

    async def main():
        worker = AgentWorker(["http://127.0.0.1:9/v1"], "scripted", None, {}, 10.0, str(tmp_path))
        with ScriptedLLM(lambda body: tool_call_message("submit", {})) as server:
            client = ChatClient(server.base_url, "scripted", max_attempts=1)
            sandbox_closer.set(worker._close_later)  # as run_rollout sets it for each rollout's task
            result = await run_episode(UniAgentLoop(agent), _spec(agent), client, open_sandbox=opener(sandbox))
            await client.aclose()
        closed_when_returned = sandbox.closed
        await worker.close()
        return result, closed_when_returned

    result, closed_when_returned = asyncio.run(main())
    assert result.patch == PATCH and result.total_s < 0.5  # the patch was taken; the close was not waited for
    assert not closed_when_returned and sandbox.closed  # AgentWorker.close waited for it
