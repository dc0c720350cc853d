"""The whole run on a real LocalCluster with real bubblewrap sandboxes and real verification.

The model is a ScriptedLLM: a real OpenAI-compatible HTTP server whose replies come from a policy function, so the
agent's behaviour (and hence the expected reward and exit reason) is known. The real-model run is in test_e2e_llm.py.
"""

import json

import pandas as pd
import pytest

from conftest import AGENT_CONFIG, assistant_turns
from uni_agent import AgentConfigs, run
from uni_agent.events import unbatch
from uni_agent.llm import LLMError
from uni_agent.tasks.swe_form import BUNDLED_DIR
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM, tool_call_message

INSTANCES = [json.loads(p.read_text()) for p in sorted(BUNDLED_DIR.glob("*/instance.json"))]


def _instance_for(body):
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return next(i for i in INSTANCES if i["problem_statement"].strip() in user)


def solver(body):
    """Looks around, applies the task's gold patch with a shell heredoc, runs the tests, submits."""
    turn = assistant_turns(body)
    if turn == 0:
        return tool_call_message("execute_bash", {"command": "git status --short && ls"})
    if turn == 1:
        patch = _instance_for(body)["patch"]
        return tool_call_message("execute_bash", {"command": f"cat > /tmp/fix.diff <<'EOF'\n{patch}EOF\ngit apply /tmp/fix.diff"})
    if turn == 2:
        return tool_call_message("execute_bash", {"command": "python -m pytest -q -p no:cacheprovider 2>&1 | tail -3"})
    return tool_call_message("submit", {})


def _run(rows, tmp_path, client, server, agents=None, **overrides):
    settings = dict(engine="external", base_url=server.base_url, model_name="scripted", agent_workers=2,
                    output_dir=str(tmp_path / "out"), progress=False, n=1)
    settings.update(overrides)
    return run(rows, agents or AgentConfigs.load(AGENT_CONFIG).override_all({"interaction": {"tools_in": "api", "constrain_tool_calls": False}}),
               client=client, **settings)


def test_solver_resolves_tasks_and_results_are_written(rows, tmp_path, dask_client):
    with ScriptedLLM(solver) as server:
        outcome = _run(rows[:4], tmp_path, dask_client, server, n=2)
    results = pd.read_parquet(tmp_path / "out" / "results")
    assert len(results) == 8
    assert sorted(zip(results.instance_id, results.rollout)) == sorted(
        (r["instance_id"], k) for r in rows[:4] for k in range(2))
    assert (results.exit_reason == "submitted").all(), results[["instance_id", "exit_reason", "error"]]
    assert (results.reward == 1.0).all(), results.verification.tolist()
    assert results.patch.str.contains("diff --git").all()
    messages = json.loads(results.messages.iloc[0])
    assert [m["role"] for m in messages[:3]] == ["system", "user", "assistant"]
    assert any(m["role"] == "tool" and "[exit code: 0]" in m["content"] for m in messages)
    verification = json.loads(results.verification.iloc[0])
    assert verification["patch_applied"] and verification["status"] == "resolved"
    assert set(verification["fail_to_pass"].values()) == {"PASSED"}
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["num_tasks"] == 4 and summary["n"] == 2 and summary["num_rollouts"] == 8
    assert summary["avg_at_n"] == 1.0 and summary["resolved"] == 8
    assert summary["exit_reasons"]["submitted"] == 8
    assert outcome.summary == summary
    # Rollouts ran on both agent workers, and every turn reached the endpoint.
    assert results.worker.nunique() == 2
    assert (results.num_turns == 4).all()
    log_lines = [json.loads(line) for f in (tmp_path / "out" / "logs").glob("agent-worker-*.jsonl")
                 for line in f.read_text().splitlines()]
    finished = [e for e in log_lines if e["event"] == "rollout_finished"]
    assert len(finished) == 8 and all({"run_id", "instance_id", "rollout"} <= set(e) for e in finished)
    # Every rollout's state changes reached the scheduler, in order.
    events = [e for _, msg in dask_client.get_events("uni-agent") for e in unbatch(msg)
              if e.get("run_id") == summary["run_id"]]
    for instance_id, rollout in zip(results.instance_id, results.rollout):
        states = [e["state"] for e in events if (e["instance_id"], e["rollout"]) == (instance_id, rollout)]
        assert states == ["queued", "starting_sandbox", "running", "running", "running", "running", "verifying",
                          "done"], states
    done = [e for e in events if e["state"] == "done"]
    assert all(e["reward"] == 1.0 and json.loads(e["messages"]) for e in done)
    # Turn events travel in batches (uni_agent.events.WorkerEvents), the other states one by one.
    batches = [msg for _, msg in dask_client.get_events("uni-agent") if msg.get("kind") == "batch"
               and all(e.get("run_id") == summary["run_id"] for e in msg["events"])]
    assert any(e["state"] == "running" for b in batches for e in b["events"])


def test_rerun_resumes_without_redoing_rollouts(rows, tmp_path, dask_client):
    with ScriptedLLM(solver) as server:
        _run(rows[:2], tmp_path, dask_client, server)
        first = len(server.requests)
        outcome = _run(rows[:3], tmp_path, dask_client, server)
        # Only the new task ran: 4 turns for one rollout.
        assert len(server.requests) - first == 4
    assert len(outcome.results) == 3
    assert outcome.results.set_index(["instance_id", "rollout"]).index.is_unique


def test_empty_submission_gets_reward_zero(rows, tmp_path, dask_client):
    with ScriptedLLM(lambda body: tool_call_message("submit", {})) as server:
        outcome = _run(rows[:2], tmp_path, dask_client, server)
    assert (outcome.results.reward == 0).all()
    assert (outcome.results.exit_reason == "submitted").all()
    assert (outcome.results.patch == "").all()


def test_agent_workers_0_gives_every_sandbox_worker_an_agent_worker(rows, tmp_path, dask_client):
    """The default (0): one actor per sandbox worker process. Actors in one process share its event loop, so a fixed
    count either left processes of a larger cluster unused (2 actors on a cluster of 20) or doubled up on one."""
    with ScriptedLLM(lambda b: tool_call_message("submit", {})) as server:
        outcome = _run(rows[:4], tmp_path, dask_client, server, agent_workers=0, n=2)
    sandbox_workers = set(dask_client.scheduler_info(n_workers=-1)["workers"])
    assert len(sandbox_workers) == 2
    assert set(outcome.results.worker) == sandbox_workers


def test_exit_reasons(rows, tmp_path, dask_client):
    def malformed_then_submit(body):
        if assistant_turns(body) == 0:
            return {"role": "assistant", "content": "<tool_call>{not json</tool_call>"}
        return tool_call_message("submit", {})

    with ScriptedLLM(lambda b: tool_call_message("execute_bash", {"command": "echo hi"})) as server:
        out = _run(rows[:1], tmp_path / "a", dask_client, server, max_turns=3)
    assert out.results.exit_reason.tolist() == ["max_turns"] and out.results.num_turns.tolist() == [3]

    with ScriptedLLM(malformed_then_submit) as server:
        out = _run(rows[:1], tmp_path / "b", dask_client, server)
    assert out.results.exit_reason.tolist() == ["submitted"]
    messages = json.loads(out.results.messages[0])
    assert any("Error in your tool call" in str(m["content"]) for m in messages)

    context_error = Fault(400, '{"error": {"message": "This model\'s maximum context length is 4096 tokens"}}')
    with ScriptedLLM(lambda b: context_error) as server:
        out = _run(rows[:1], tmp_path / "c", dask_client, server)
    assert out.results.exit_reason.tolist() == ["context_limit"]

    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"interaction": {"tools_in": "api", "constrain_tool_calls": False, "action_timeout": 1, "timeout_budget": 0}})
    with ScriptedLLM(lambda b: tool_call_message("execute_bash", {"command": "sleep 20"})) as server:
        out = _run(rows[:1], tmp_path / "d", dask_client, server, agents=agents)
    assert out.results.exit_reason.tolist() == ["command_timeouts"]
    assert out.results.total_s[0] < 15

    # The episode's wall clock also ends a rollout in the middle of a long command.
    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"interaction": {"tools_in": "api", "constrain_tool_calls": False, "action_timeout": 60, "episode_timeout": 2}})
    with ScriptedLLM(lambda b: tool_call_message("execute_bash", {"command": "sleep 30"})) as server:
        out = _run(rows[:1], tmp_path / "e", dask_client, server, agents=agents)
    assert out.results.exit_reason.tolist() == ["wall_clock"]
    assert "wall-clock budget of 2 s" in out.results.error[0]
    assert out.results.total_s[0] < 10


def test_text_tool_calls_are_parsed(rows, tmp_path, dask_client):
    """Servers without structured tool calls: the tools go in the prompt and calls come back as hermes text."""
    def text_policy(body):
        assert "tools" not in body and "<tool_call>" in body["messages"][0]["content"]
        allowed = [v["properties"]["name"]["enum"] for v in body["response_format"]["schema"]["anyOf"]]
        assert sorted(allowed) == [["execute_bash"], ["str_replace_editor"], ["submit"]]
        if assistant_turns(body) == 0:
            return {"role": "assistant", "content": 'Let me look.\n<tool_call>\n{"name": "execute_bash", '
                    '"arguments": {"command": "export SEEN=yes; cd tests && pwd"}}\n</tool_call>'}
        if assistant_turns(body) == 1:
            return {"role": "assistant", "content": '<tool_call>{"name": "execute_bash", "arguments": '
                    '{"command": "echo $SEEN $PWD"}}</tool_call>'}
        return {"role": "assistant", "content": '<tool_call>{"name": "submit", "arguments": {}}</tool_call>'}

    agents = AgentConfigs.load(AGENT_CONFIG)  # tools_in: prompt, tool_call_parser: hermes
    with ScriptedLLM(text_policy) as server:
        out = _run(rows[:1], tmp_path, dask_client, server, agents=agents)
    assert out.results.exit_reason.tolist() == ["submitted"]
    messages = json.loads(out.results.messages[0])
    observations = [m["content"] for m in messages if m["content"].startswith("Observation from")]
    assert "yes /testbed/tests" in observations[1]  # cwd and exports persisted between calls


def test_unreachable_endpoint_fails_fast_naming_the_url(rows, tmp_path, dask_client):
    with pytest.raises(LLMError, match="127.0.0.1:9"):
        run(rows[:1], AGENT_CONFIG, client=dask_client, engine="external", base_url="http://127.0.0.1:9/v1",
            model_name="x", output_dir=str(tmp_path), progress=False)


def test_bad_rows_are_reported_and_the_rest_run(rows, tmp_path, dask_client):
    bad = dict(rows[1], agent_name="nobody")
    with ScriptedLLM(lambda body: tool_call_message("submit", {})) as server:
        outcome = _run([rows[0], bad], tmp_path, dask_client, server)
    assert len(outcome.results) == 1
    assert len(outcome.problems) == 1 and "nobody" in outcome.problems[0].error
    assert outcome.problems[0].row_index == 1
    assert outcome.summary["rejected_rows"] == 1
