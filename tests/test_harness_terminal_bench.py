"""A harness program on Terminal-Bench rows: graded in the agent's own sandbox right after the program exits, as for
our loop. Real LocalCluster, real local sandboxes (network off), the stdlib example program (examples/harness/agent.py)
as the agent, the scripted endpoint (a real HTTP server) as its model.
"""

from __future__ import annotations

from typing import Any

from conftest import assistant_turns
from test_harness_agent import EXAMPLE
from test_terminal_bench import SOLVING_COMMANDS, local_rows  # noqa: F401 - the bundled tasks as local rows, a fixture

from uni_agent import AgentConfigs, run
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

TASK = "hello-file"


def harness_agents() -> AgentConfigs:
    return AgentConfigs({"swe_agent": {
        "name": "swe_agent", "_target_": "uni_agent.harness.HarnessAgent",
        "harness": {"command": "python3 /opt/example/agent.py", "mounts": {"/opt/example": str(EXAMPLE)}},
    }}, "test")


def test_a_harness_program_is_graded_in_its_own_sandbox_on_terminal_bench(
        local_rows: list[dict[str, Any]], tmp_path: Any, dask_client: Any) -> None:
    rows = [r for r in local_rows if r["instance_id"] == TASK]

    def solver(body: dict[str, Any]) -> dict[str, Any]:
        if assistant_turns(body) == 0:
            return tool_call_message("bash", {"command": SOLVING_COMMANDS[TASK]})
        return tool_call_message("submit", {})

    settings = dict(engine="external", model_name="scripted", agent_workers=1, progress=False, n=1)
    with ScriptedLLM(solver) as server:
        solved = run(rows, harness_agents(), client=dask_client, base_url=server.base_url,
                     output_dir=str(tmp_path / "solved"), **settings).results.iloc[0]
    with ScriptedLLM(lambda body: tool_call_message("submit", {})) as server:
        empty = run(rows, harness_agents(), client=dask_client, base_url=server.base_url,
                    output_dir=str(tmp_path / "empty"), **settings).results.iloc[0]
    assert solved.exit_reason == "submitted" and solved.reward == 1.0, (solved.error, solved.verification)
    assert solved.num_turns == 2
    assert empty.exit_reason == "submitted" and empty.reward == 0.0
