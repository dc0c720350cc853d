"""Terminal-Bench 2 on the container backend, for real: each task's image is built with `podman build` from its
environment/Dockerfile on the locally built test image (tests/container_image.py; no registry, no network), then the
oracle, the empty answer and an agent run (ScriptedLLM over HTTP, Dask LocalCluster) go through podman + runc.
"""

from __future__ import annotations

import json
import subprocess

import pandas as pd
import pytest
from container_image import ImageUnavailable, ensure_image
from test_sandbox_container import labelled_containers
from test_terminal_bench import BUNDLED, check_agent_run, preprocess, terminal_agent

from conftest import REPO_ROOT
from uni_agent import run
from uni_agent.config import AgentConfigs
from uni_agent.dataset import read_rows
from uni_agent.sandbox.container import owner_id
from uni_agent.testing.scripted_llm import ScriptedLLM
from uni_agent.verify_run import verify_all

PODMAN_CONFIG = REPO_ROOT / "examples" / "agent_interaction" / "agent_config_podman.yaml"


@pytest.fixture(scope="module")
def podman_rows(tmp_path_factory) -> list[dict]:
    try:
        base, _ = ensure_image()
    except ImageUnavailable as exc:  # tests/run.sh's machine can build it: a missing image is a failure
        pytest.fail(f"the podman test image is unavailable: {exc}")
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
                      model_name="scripted", num_workers=2, output_dir=str(tmp_path / "out"), progress=False, n=1)
    results = check_agent_run(outcome, BUNDLED, tmp_path / "out")
    # The image's workdir is no repository: the rollout's first command made a baseline commit, so the agent's
    # change came back as a diff and was graded in a fresh container of the same image.
    assert "+grezvany orapu" in results.loc["use-installed-tool", "patch"]
