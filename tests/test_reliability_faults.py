"""Injected faults of the LLM endpoint and of sandboxes: each ends in a retry that succeeds, or in a clear error for
that one rollout while the rest of the run goes on. Real processes throughout: the session's LocalCluster, real
bubblewrap sandboxes, and a ScriptedLLM (a real OpenAI-compatible HTTP server, see uni_agent/testing/scripted_llm.py)
whose policy injects the faults.
"""

import asyncio
import functools
import json
import random
import threading
from collections import Counter

import pandas as pd
from tenacity import wait_exponential_jitter

from conftest import AGENT_CONFIG, assistant_turns
from uni_agent import AgentConfigs, run
from uni_agent.sandbox import start as sandbox_start
from uni_agent.episode.agent_loop import UniAgentLoop
from uni_agent.episode.envelope import run_episode
from uni_agent.driver.dataset import build_specs
from uni_agent.llm import ChatClient
from uni_agent.sandbox import SandboxStartError
from uni_agent.sandbox.local import LocalSandbox, sandbox_root
from uni_agent.sandbox.userns import remove_tree
from uni_agent.tasks.swe_form import BUNDLED_DIR
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM, tool_call_message

INSTANCES = [json.loads(p.read_text()) for p in sorted(BUNDLED_DIR.glob("*/instance.json"))]


def _instance_id(body) -> str:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return next(i["instance_id"] for i in INSTANCES if i["problem_statement"].strip() in user)


def look_then_submit(body):
    if assistant_turns(body) == 0:
        return tool_call_message("execute_bash", {"command": "echo looked"})
    return tool_call_message("submit", {})


def _agents(**interaction):
    return AgentConfigs.load(AGENT_CONFIG).override_all(
        {"concurrency": 16, "interaction": {"tools_in": "api", "constrain_tool_calls": False, **interaction}})


class DroppedConnection(Exception):
    """Raised inside the ScriptedLLM's handler: the server closes the connection without an answer."""


# Per instance: what its first requests get. "always" faults never stop; the others hit the first k requests.
FAULT_PLAN = {
    0: ("500 then ok", 1),
    1: ("429 then ok", 2),
    2: ("malformed JSON then ok", 1),
    3: ("empty choices then ok", 1),
    4: ("timeout then ok", 1),
    5: ("dropped connection then ok", 1),
    6: ("always 500", None),
    7: ("always malformed JSON", None),
    8: ("always empty choices", None),
    9: ("always timeout", None),
    10: ("always dropped connection", None),
    # 11 and 12: no fault, must run normally next to the others
}
LLM_TIMEOUT = 2.0


def test_llm_endpoint_faults_are_retried_or_end_one_rollout(rows, tmp_path, dask_client, request):
    plan = {INSTANCES[i]["instance_id"]: fault for i, fault in FAULT_PLAN.items()}
    seen: Counter = Counter()
    injected: Counter = Counter()
    lock = threading.Lock()
    stop = threading.Event()  # ends the deliberately slow replies when the test is over

    def policy(body):
        instance = _instance_id(body)
        with lock:
            seen[instance] += 1
            count = seen[instance]
        name, first_k = plan.get(instance, ("none", 0))
        if name != "none" and (first_k is None or count <= first_k):
            with lock:
                injected[name] += 1
            if name.startswith(("500", "always 500")):
                return Fault(500, '{"error": {"message": "injected server error"}}')
            if name.startswith("429"):
                return Fault(429, '{"error": {"message": "rate limited"}}')
            if "malformed" in name:
                return Fault(200, '{"choices": [{"message": {"content": "cut off')
            if "empty choices" in name:
                return Fault(200, '{"id": "x", "object": "chat.completion", "choices": []}')
            if "timeout" in name:
                stop.wait(LLM_TIMEOUT * 2)  # longer than the client waits
                return look_then_submit(body)
            if "dropped" in name:
                raise DroppedConnection("closing without an answer")
        return look_then_submit(body)

    with ScriptedLLM(policy) as server:
        try:
            out = run(rows, _agents(), client=dask_client, engine="external", base_url=server.base_url,
                      model_name="scripted", agent_workers=2, n=1, output_dir=str(tmp_path / "out"), progress=False,
                      llm_timeout=LLM_TIMEOUT, verify=False)
        finally:
            stop.set()
    results = out.results.set_index("instance_id")
    assert len(out.results) == len(rows) and results.index.is_unique  # every rollout recorded, exactly once

    for index, (name, _) in FAULT_PLAN.items():
        row = results.loc[INSTANCES[index]["instance_id"]]
        if name.startswith("always"):
            assert row.exit_reason == "error", (name, row.error)
            assert row.error.startswith("TransientLLMError: http://127.0.0.1:"), (name, row.error)  # names the URL
            assert seen[INSTANCES[index]["instance_id"]] == 5, name  # ChatClient.max_attempts, then given up
        else:
            assert row.exit_reason == "submitted" and pd.isna(row.error), (name, row.error)
            assert row.num_turns == 2, name
    expected_words = {"always 500": "HTTP 500", "always malformed JSON": "malformed answer",
                      "always empty choices": "malformed answer", "always timeout": "read timeout",
                      "always dropped connection": "connection dropped"}
    for index, (name, _) in FAULT_PLAN.items():
        if name in expected_words:
            assert expected_words[name] in results.loc[INSTANCES[index]["instance_id"]].error, name
    for clean in INSTANCES[11:]:
        assert results.loc[clean["instance_id"]].exit_reason == "submitted"
    assert out.summary["exit_reasons"]["error"] == 5 and out.summary["errors"] == 5
    # Every retry is in the agent workers' logs: each injected fault but the last of the 5 given-up rollouts.
    events = [json.loads(line) for f in (tmp_path / "out" / "logs").glob("agent-worker-*.jsonl")
              for line in f.read_text().splitlines()]
    assert sum(e["event"] == "llm_retry" for e in events) == sum(injected.values()) - 5
    request.node.user_properties.append(("faults_injected", sum(injected.values())))


class FlakyStartSandbox(LocalSandbox):
    """A real local sandbox whose start fails 30% of the time, after the sandbox dir has been made: the failure
    leaves something half-started that must be cleaned up."""

    rng = random.Random(1234)
    starts = 0
    failures = 0

    async def start(self) -> None:
        await super().start()
        FlakyStartSandbox.starts += 1
        if FlakyStartSandbox.rng.random() < 0.3:
            FlakyStartSandbox.failures += 1
            raise SandboxStartError(f"injected start failure of {self.name}")


def test_sandbox_start_failures_are_retried_and_leave_nothing(rows):
    """30% of sandbox starts fail: the agent loop retries them (start_retries) and every rollout completes."""
    opener = functools.partial(sandbox_start.start_sandbox, wait=wait_exponential_jitter(multiplier=0.05, max=0.2),
                               make=lambda deployment, env, name: FlakyStartSandbox(deployment, env, name=name))
    agents = _agents().override_all({"env": {"deployment": {"start_retries": 8}}})
    specs, problems = build_specs(rows, agents, "flaky-run", 2)
    assert not problems and len(specs) == 2 * len(rows)

    async def main():
        with ScriptedLLM(look_then_submit) as server:
            client = ChatClient(server.base_url, "scripted")
            try:
                return await asyncio.gather(*(run_episode(UniAgentLoop(s.agent), s, client, open_sandbox=opener)
                                              for s in specs))
            finally:
                await client.aclose()

    results = asyncio.run(main())
    assert FlakyStartSandbox.failures >= 0.15 * FlakyStartSandbox.starts, (FlakyStartSandbox.failures,
                                                                           FlakyStartSandbox.starts)
    assert [r.exit_reason for r in results] == ["submitted"] * len(specs), [r.error for r in results]
    assert FlakyStartSandbox.starts == len(specs) + FlakyStartSandbox.failures


def test_sandbox_start_that_keeps_failing_is_a_clear_rollout_error(rows):
    class BrokenSandbox(LocalSandbox):
        async def start(self) -> None:
            await super().start()
            raise SandboxStartError("injected: the sandbox never comes up")

    opener = functools.partial(sandbox_start.start_sandbox,
                               make=lambda deployment, env, name: BrokenSandbox(deployment, env, name=name))
    agents = _agents().override_all({"env": {"deployment": {"start_retries": 2}}})
    specs, _ = build_specs(rows[:2], agents, "broken-run", 1)

    async def main():
        with ScriptedLLM(look_then_submit) as server:
            client = ChatClient(server.base_url, "scripted")
            try:
                return await asyncio.gather(*(run_episode(UniAgentLoop(s.agent), s, client, open_sandbox=opener)
                                              for s in specs))
            finally:
                await client.aclose()

    results = asyncio.run(main())
    for result in results:
        assert result.exit_reason == "error" and result.num_turns == 0
        assert result.error == "SandboxStartError: injected: the sandbox never comes up"


def test_sandbox_removed_mid_rollout_ends_that_rollout_with_a_clear_error(rows, tmp_path, dask_client):
    victim = rows[0]["instance_id"]
    removed = []

    def policy(body):
        if _instance_id(body) == victim and assistant_turns(body) == 1 and not removed:
            # The sandbox dies under the agent: its directory (workspace, state) is deleted by someone else. Without
            # root its overlay's work dir (mode 0) is removable only from the user's namespace: remove_tree does that.
            dirs = list(sandbox_root().glob(f"{victim}-r0-*"))
            assert len(dirs) == 1, dirs
            remove_tree(dirs[0])
            assert not dirs[0].exists()
            removed.append(dirs[0])
            return tool_call_message("execute_bash", {"command": "ls"})
        if assistant_turns(body) < 2:
            return tool_call_message("execute_bash", {"command": "echo step"})
        return tool_call_message("submit", {})

    with ScriptedLLM(policy) as server:
        out = run(rows[:3], _agents(), client=dask_client, engine="external", base_url=server.base_url,
                  model_name="scripted", agent_workers=2, n=1, output_dir=str(tmp_path / "out"), progress=False,
                  verify=False)
    assert removed
    results = out.results.set_index("instance_id")
    row = results.loc[victim]
    assert row.exit_reason == "error", row
    assert row.error == f"SandboxError: sandbox {removed[0].name} is gone: {removed[0]} was removed while in use"
    assert row.num_turns == 2  # the command after the removal failed; nothing ran after it
    others = results.drop(index=victim)
    assert (others.exit_reason == "submitted").all(), others.error.tolist()
