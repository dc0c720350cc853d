"""Terminal-Bench 2 on the container backend, for real: each task's image is built with `podman build` from its
environment/Dockerfile on the locally built test image (tests/container_image.py; no registry, no network), then the
oracle, the empty answer and an agent run (ScriptedLLM over HTTP, Dask LocalCluster) go through podman + runc.
"""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
from container_image import image_for_tests
from test_sandbox_container import labelled_containers
from test_terminal_bench import BUNDLED, check_agent_run, preprocess, terminal_agent

from conftest import REPO_ROOT, assistant_turns
from uni_agent import run
from uni_agent.config import AgentConfigs
from uni_agent.driver.dataset import read_rows
from uni_agent.sandbox.container_reap import owner_id
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message
from uni_agent.driver.verify import verify_all

PODMAN_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_podman.yaml"


@pytest.fixture(scope="module")
def podman_rows(tmp_path_factory) -> list[dict]:
    base, _ = image_for_tests()  # a failure where it could be built; a skip where only root could
    out = tmp_path_factory.mktemp("tb-podman")
    preprocess(out, "--deployment", "podman", "--build-images", "--build-arg", f"BASE_IMAGE={base}",
               "--build-network", "none")
    rows = read_rows(out / "terminal_bench_v2_podman.parquet")
    for row in rows:  # every image exists now, under the tag its row names
        image = row["extra_info"]["tools_kwargs"]["env"]["deployment"]["image"]
        assert subprocess.run(["podman", "image", "exists", image]).returncode == 0, image
    return rows


@pytest.fixture(autouse=True)
def no_leftover_containers():
    before = labelled_containers(owner_id())
    yield
    assert labelled_containers(owner_id()) - before == set(), "containers left behind"


def test_oracle_earns_one_and_empty_zero_in_task_images(podman_rows, tmp_path, dask_client):
    address = dask_client.scheduler.address
    oracle = verify_all(podman_rows, PODMAN_CONFIG, patch="oracle", output_dir=str(tmp_path / "oracle"),
                        scheduler_address=address, progress=False)
    assert oracle.summary["resolved_ids"] == BUNDLED and oracle.summary["avg_at_n"] == 1.0
    # use-installed-tool's tool exists only in its image (a RUN put it in /opt): the image really is the task's.
    graded = pd.read_parquet(tmp_path / "oracle" / "verify_oracle.parquet").set_index("instance_id")
    tool = json.loads(graded.loc["use-installed-tool", "verification"])
    assert tool["reward"] == 1.0 and "grezvany orapu" in tool["log_tail"]  # rot13("terminal bench")
    empty = verify_all(podman_rows, PODMAN_CONFIG, patch="empty", output_dir=str(tmp_path / "empty"),
                       scheduler_address=address, progress=False)
    assert empty.summary["resolved"] == 0 and empty.summary["wrong_answer_ids"] == BUNDLED


def test_agent_run_end_to_end_in_task_images(podman_rows, tmp_path, dask_client):
    agents = AgentConfigs.load(PODMAN_CONFIG)
    with ScriptedLLM(terminal_agent) as server:
        outcome = run(podman_rows, agents, client=dask_client, engine="external", base_url=server.base_url,
                      model_name="scripted", agent_workers=2, output_dir=str(tmp_path / "out"), progress=False, n=1)
    results = check_agent_run(outcome, BUNDLED, tmp_path / "out")
    # The image's workdir is no repository: the rollout's first command made a baseline commit, so the agent's
    # change also comes back as a diff (the grading itself ran in the agent's container).
    assert "+grezvany orapu" in results.loc["use-installed-tool", "patch"]


def test_verifier_runs_where_the_agent_worked(tmp_path, dask_client):
    """A task whose answer lies outside the workdir (/etc/greeter/port): the tests run in the agent's own
    container after its episode (reward.in_agent_sandbox), as Terminal-Bench's harness runs them, so they see it.
    A fresh container with the workdir's diff replayed would not: the patch is empty."""
    base, _ = image_for_tests()
    preprocess(tmp_path, "--tasks-dir", str(REPO_ROOT / "tests" / "fixtures" / "terminal_bench_machine"),
               "--deployment", "podman", "--build-images", "--build-arg", f"BASE_IMAGE={base}",
               "--build-network", "none")
    rows = read_rows(tmp_path / "terminal_bench_v2_podman.parquet")
    assert [r["extra_info"]["tools_kwargs"]["reward"]["in_agent_sandbox"] for r in rows] == [True]

    def configure_then_submit(body):
        if assistant_turns(body) == 0:
            command = "mkdir -p /etc/greeter && echo 8042 > /etc/greeter/port"
            return tool_call_message("execute_bash", {"command": command})
        return tool_call_message("submit", {})

    with ScriptedLLM(configure_then_submit) as server:
        outcome = run(rows, AgentConfigs.load(PODMAN_CONFIG), client=dask_client, engine="external",
                      base_url=server.base_url, model_name="scripted", output_dir=str(tmp_path / "out"),
                      progress=False, n=1)
    result = outcome.results.iloc[0]
    verification = json.loads(result["verification"])
    assert result["reward"] == 1.0 and verification["status"] == "resolved", verification
    assert result["patch"] == ""  # nothing changed under the workdir: a replayed diff would have scored 0
    assert result["verify_s"] > 0
