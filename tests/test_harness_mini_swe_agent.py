"""mini-swe-agent (2.4.6, its own CLI unchanged) as the agent of a whole run: a real LocalCluster, real sandboxes with
the network off (local; local over an image and podman with the Debian 12 test image, whose Python the prepared venv
runs on), the real gateway and relay, real grading in a fresh sandbox. The model is the scripted endpoint (a real HTTP
server, uni_agent.testing.scripted_llm) answering mini's `bash` tool calls: applying the task's gold patch resolves it
(reward 1), submitting at once does not (reward 0).

The venv is made once per machine by `uni-agent harness prepare mini-swe-agent` (pip; cached under
~/.cache/uni-agent/harness, or UNI_AGENT_HARNESS_VENV when set).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO_ROOT, assistant_turns
from test_sandbox_container import image  # noqa: F401 - the podman test image, a session fixture

from uni_agent import AgentConfigs, run
from uni_agent.harness.prepare import MINI_SWE_AGENT_VERSION, prepare
from uni_agent.tasks.swe_form import BUNDLED_DIR
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message

UNI_AGENT = Path(sys.executable).parent / "uni-agent"
CONFIG = REPO_ROOT / "examples" / "harness" / "mini_swe_agent.yaml"
INSTANCES = [json.loads(p.read_text()) for p in sorted(BUNDLED_DIR.glob("*/instance.json"))]
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


@pytest.fixture(scope="session")
def mini_venv() -> Path:
    """Made as the docs say, with the CLI (which prints the directory); a second call finds it made."""
    given = os.environ.get("UNI_AGENT_HARNESS_VENV")
    if given:
        return Path(given)
    made = subprocess.run([str(UNI_AGENT), "harness", "prepare", "mini-swe-agent"], capture_output=True, text=True,
                          timeout=900)
    assert made.returncode == 0, made.stderr[-3000:]
    venv = Path(made.stdout.strip())
    assert (venv / "bin" / "mini").exists() and venv == prepare("mini-swe-agent")
    return venv


def test_prepare_names_the_known_recipes_for_an_unknown_one() -> None:
    done = subprocess.run([str(UNI_AGENT), "harness", "prepare", "no-such-harness"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1 and "no recipe named 'no-such-harness'" in done.stderr and "mini-swe-agent" in \
        done.stderr, done.stderr


def agents(venv: Path) -> AgentConfigs:
    """The shipped config, pointed at the venv; the scripted endpoint speaks structured tool calls (tools_in: api)."""
    entry = yaml.safe_load(CONFIG.read_text())[0]
    entry["harness"]["mounts"] = {"/opt/mini-swe-agent": str(venv)}
    entry["interaction"] = {"max_turns": 10, "tools_in": "api"}
    return AgentConfigs({entry["name"]: entry}, str(CONFIG))


def solver(body: dict[str, Any]) -> dict[str, Any]:
    """Looks around, applies the task's gold patch, submits (mini's way: its echo)."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    instance = next(i for i in INSTANCES if i["problem_statement"].strip()[:200] in task)
    turn = assistant_turns(body)
    if turn == 0:
        return tool_call_message("bash", {"command": "git status --short && ls"}, content="THOUGHT: look first.")
    if turn == 1:
        command = f"cat > /tmp/fix.diff <<'EOF'\n{instance['patch']}EOF\ngit apply /tmp/fix.diff && git diff --stat"
        return tool_call_message("bash", {"command": command}, content="THOUGHT: fix it.")
    return tool_call_message("bash", {"command": SUBMIT}, content="THOUGHT: done.")


def on_backend(rows: list[dict[str, Any]], backend: str, request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The rows with their deployment moved to `backend` (the bundled rows name a local sandbox)."""
    if backend == "local":
        return rows
    tag = request.getfixturevalue("image")
    moved = copy.deepcopy(rows)
    for row in moved:
        deployment = row["extra_info"]["tools_kwargs"]["env"]["deployment"]
        deployment.update({"type": "podman", "image": tag, "pull": "never", "network": "none"} if backend == "podman"
                          else {"image": tag})
    return moved


@pytest.mark.parametrize("backend", ["local", "local-image", "podman"])
def test_mini_swe_agent_resolves_a_task_and_an_empty_submission_does_not(
        backend: str, rows: list[dict[str, Any]], tmp_path: Path, dask_client: Any, mini_venv: Path,
        request: pytest.FixtureRequest) -> None:
    chosen = on_backend(rows[:1], backend, request)
    settings = dict(engine="external", model_name="scripted", agent_workers=1, progress=False, n=1)
    with ScriptedLLM(solver) as server:
        solved = run(chosen, agents(mini_venv), client=dask_client, base_url=server.base_url,
                     output_dir=str(tmp_path / "solved"), **settings).results
    with ScriptedLLM(lambda body: tool_call_message("bash", {"command": SUBMIT})) as server:
        empty = run(chosen, agents(mini_venv), client=dask_client, base_url=server.base_url,
                    output_dir=str(tmp_path / "empty"), **settings).results
    row = solved.iloc[0]
    harness = json.loads(row.harness)
    assert row.exit_reason == "submitted" and row.reward == 1.0, (row.error, harness["output_tail"][-2000:])
    assert harness["exit_code"] == 0 and "exit status: Submitted" in harness["output_tail"]
    assert row.num_turns == 3 and "diff --git" in row.patch
    messages = json.loads(row.messages)
    assert messages[0]["role"] == "system" and messages[-1]["role"] == "assistant" and len(messages) == 7
    assert json.loads(row.chains)[0]["calls"] == 3
    assert empty.iloc[0].exit_reason == "submitted" and empty.iloc[0].reward == 0.0 and empty.iloc[0].patch == ""


def test_the_recipe_pins_the_bench_extra_s_version() -> None:
    """One pin for mini-swe-agent: the recipe and pyproject's `bench` extra name the same version."""
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    assert f'"mini-swe-agent=={MINI_SWE_AGENT_VERSION}"' in pyproject
