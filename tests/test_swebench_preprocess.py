"""SWE-bench Verified preprocessing: local Parquet/JSONL/JSON input → seed-schema rows, per deployment.

The hub cannot be reached from here: the hub path is tested for its failure message (HF_HUB_OFFLINE=1)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import AGENT_CONFIG, REPO_ROOT
from uni_agent import AgentConfigs
from uni_agent.driver.dataset import build_specs, read_rows
from uni_agent.swebench.instances import METADATA_FIELDS
from uni_agent.swebench.preprocess import build_rows, preprocess

FIXTURES = Path(__file__).parent / "fixtures" / "swebench"
SCRIPT = REPO_ROOT / "examples" / "data_preprocess" / "swe_bench_verified.py"
INSTANCES = [json.loads(line) for line in (FIXTURES / "instances.jsonl").read_text().splitlines()]
IDS = [i["instance_id"] for i in INSTANCES]


def _as_official_parquet(path: Path, rows) -> Path:
    """The official Parquet layout: every field a string (FAIL_TO_PASS / PASS_TO_PASS JSON strings)."""
    table = [{k: (json.dumps(v) if isinstance(v, list) else v) for k, v in row.items()} for row in rows]
    pq.write_table(pa.Table.from_pylist(table), path)
    return path


def _script(*args, env=None, cwd=REPO_ROOT):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("deployment", ["modal", "docker", "podman", "vefaas", "local"])
def test_script_writes_seed_schema_rows_for_each_deployment(tmp_path, deployment):
    source = _as_official_parquet(tmp_path / "verified.parquet", INSTANCES)
    proc = _script("--local-save-dir", str(tmp_path / "out"), "--input", str(source), "--deployment", deployment)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "out" / f"swe_bench_verified_{deployment}.parquet"
    assert f"wrote {len(INSTANCES)} instances to {path}" in proc.stdout
    rows = pq.read_table(path).to_pylist()
    assert [r["instance_id"] for r in rows] == IDS
    for row, original in zip(rows, INSTANCES, strict=True):
        assert row["agent_name"] == "swe_agent" and row["data_source"] == "swe_bench_verified"
        system, user = row["prompt"]
        assert system["role"] == "system" and user["role"] == "user"
        assert "/testbed" in user["content"] and "submit" in user["content"]
        assert original["problem_statement"].strip() in user["content"]
        assert row["extra_info"]["instance_id"] == row["instance_id"]
        kwargs = row["extra_info"]["tools_kwargs"]
        target = kwargs["env"]["deployment"]
        org, _, rest = original["instance_id"].partition("__")
        key = f"sweb.eval.x86_64.{org.lower()}_1776_{rest.lower()}"
        expected = {
            "modal": {"type": "modal", "image": f"swebench/{key}"},
            "docker": {"type": "docker", "image": f"swebench/{key}"},
            "podman": {"type": "podman", "image": f"swebench/{key}"},
            "vefaas": {"type": "vefaas",
                       "image": f"enterprise-public-cn-beijing.cr.volces.com/swe-bench-verified/{key}:v2"},
            # the same image, run by bubblewrap over its root filesystem (--local-repos: the host's instead)
            "local": {"type": "local", "image": f"swebench/{key}", "workdir": "/testbed"},
        }[deployment]
        assert target == expected
        assert kwargs["env"]["post_setup_cmd"] == ""
        reward = kwargs["reward"]
        assert reward["name"] == "swe_bench" and set(reward["metadata"]) == set(METADATA_FIELDS)
        meta = reward["metadata"]
        for field in ("repo", "version", "base_commit", "patch", "test_patch", "problem_statement"):
            assert meta[field] == original[field]
        for field in ("FAIL_TO_PASS", "PASS_TO_PASS"):  # JSON strings, whatever the input had
            value = original[field]
            assert json.loads(meta[field]) == (value if isinstance(value, list) else json.loads(value))


def test_image_names_are_lower_cased():
    row = dict(INSTANCES[0], instance_id="Astropy__Astropy-12907")
    rows, problems = build_rows([row], "podman")
    assert not problems
    assert rows[0]["extra_info"]["tools_kwargs"]["env"]["deployment"]["image"] == \
        "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907"


def test_a_registry_in_front_of_the_image(tmp_path):
    proc = _script("--local-save-dir", str(tmp_path), "--input", str(FIXTURES / "instances.jsonl"),
                   "--deployment", "podman", "--image-registry", "docker.io/", "--max-instances", "1")
    assert proc.returncode == 0, proc.stderr
    row = read_rows(tmp_path / "swe_bench_verified_podman.parquet")[0]
    assert row["extra_info"]["tools_kwargs"]["env"]["deployment"]["image"] == \
        "docker.io/swebench/sweb.eval.x86_64.astropy_1776_astropy-12907"


@pytest.mark.parametrize("fmt", ["jsonl", "json"])
def test_jsonl_and_json_inputs(tmp_path, fmt):
    source = tmp_path / f"verified.{fmt}"
    if fmt == "jsonl":
        source.write_text("".join(json.dumps(r) + "\n" for r in INSTANCES))
    else:
        source.write_text(json.dumps(INSTANCES))
    path, count, problems = preprocess(tmp_path / "out", source, "docker")
    assert count == len(INSTANCES) and not problems
    assert path == tmp_path / "out" / "swe_bench_verified_docker.parquet"


AGENT_YAML = """
- name: swe_agent
  interaction: {action_timeout: 60, max_turns: 50}
  env:
    deployment: {type: local, startup_timeout: 600, runtime_timeout: 1800, deployment_timeout: 3600}
  reward: {eval_timeout: 1800}
"""


def test_rows_load_as_rollout_specs_for_the_container_and_modal_backends(tmp_path):
    # The row sets the deployment type; the YAML deployment holds only keys common to all backends.
    (tmp_path / "agent.yaml").write_text(AGENT_YAML)
    agents = AgentConfigs.load(tmp_path / "agent.yaml")
    for deployment in ("docker", "podman", "modal"):
        path, _, _ = preprocess(tmp_path, FIXTURES / "instances.jsonl", deployment)
        specs, problems = build_specs(read_rows(path), agents, "run", 1, str(path))
        assert not problems, problems[:2]
        assert [s.instance_id for s in specs] == IDS
        spec = specs[0]
        assert spec.agent.env.deployment.type == deployment
        assert spec.agent.env.deployment.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907"
        assert spec.agent.reward.name == "swe_bench"
        assert spec.agent.reward.metadata["version"] == "4.3"


def test_local_rows_point_at_a_directory_of_repositories(tmp_path):
    path, _, _ = preprocess(tmp_path, FIXTURES / "instances.jsonl", "local", local_repos=tmp_path / "repos")
    rows = read_rows(path)
    assert rows[0]["extra_info"]["tools_kwargs"]["env"]["deployment"] == {
        "type": "local", "workdir": "/testbed", "repo": str((tmp_path / "repos" / IDS[0]).resolve())}
    specs, problems = build_specs(rows, AgentConfigs.load(AGENT_CONFIG), "run", 1, str(path))
    assert not problems and specs[0].agent.env.deployment.repo.endswith(IDS[0])


def test_malformed_rows_are_reported_with_index_and_instance_id(tmp_path):
    good = INSTANCES[:3]
    bad = [
        {k: v for k, v in INSTANCES[3].items() if k != "test_patch"},  # missing field
        dict(INSTANCES[4], version="9.9"),  # not a version of this repo
        dict(INSTANCES[5], FAIL_TO_PASS="[not json"),
        dict(INSTANCES[6], repo="someone/unknown"),
        dict(INSTANCES[7], FAIL_TO_PASS="[]"),
        dict(INSTANCES[0]),  # duplicate of row 0
        dict(INSTANCES[8], test_patch="this is not a diff"),
        dict(INSTANCES[9], instance_id="no-double-underscore-1"),
        dict(INSTANCES[10], problem_statement=None),
    ]
    source = tmp_path / "mixed.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in good + bad))
    proc = _script("--local-save-dir", str(tmp_path / "out"), "--input", str(source), env={"DEPLOYMENT": "podman"})
    assert proc.returncode == 0, proc.stderr
    assert f"wrote 3 instances to {tmp_path / 'out' / 'swe_bench_verified_podman.parquet'} (9 malformed rows " \
           "skipped)" in proc.stdout
    messages = [line for line in proc.stderr.splitlines() if line.startswith("skipped malformed row")]
    assert len(messages) == 9
    expected = [
        (3, INSTANCES[3]["instance_id"], "missing fields ['test_patch']"),
        (4, INSTANCES[4]["instance_id"], "version '9.9' is not a known version of"),
        (5, INSTANCES[5]["instance_id"], "FAIL_TO_PASS is not a JSON list"),
        (6, INSTANCES[6]["instance_id"], "repo 'someone/unknown' is not in swebench's spec table"),
        (7, INSTANCES[7]["instance_id"], "FAIL_TO_PASS is empty"),
        (8, INSTANCES[0]["instance_id"], "duplicate instance_id"),
        (9, INSTANCES[8]["instance_id"], "test_patch is not a unified diff"),
        (10, "no-double-underscore-1", "is not of the form <org>__<repo>-<number>"),
        (11, INSTANCES[10]["instance_id"], "missing fields ['problem_statement']"),
    ]
    for message, (index, instance_id, text) in zip(messages, expected, strict=True):
        assert message.startswith(f"skipped malformed row {index} (instance_id={instance_id}): "), message
        assert text in message, message
    assert [r["instance_id"] for r in read_rows(tmp_path / "out" / "swe_bench_verified_podman.parquet")] == IDS[:3]


def test_versions_given_as_numbers(tmp_path):
    rows, problems = build_rows([dict(INSTANCES[1], version=3.0)], "docker")  # django 3.0 as a JSON number
    assert not problems and rows[0]["extra_info"]["tools_kwargs"]["reward"]["metadata"]["version"] == "3.0"
    sklearn = next(r for r in INSTANCES if r["repo"] == "scikit-learn/scikit-learn")
    rows, problems = build_rows([dict(sklearn, version=0.20)], "docker")  # "0.20" lost as 0.2: refused
    assert not rows and "version '0.2' is not a known version of scikit-learn/scikit-learn" in problems[0].error


def test_max_instances_keeps_the_first_valid_ones(tmp_path):
    rows = [dict(INSTANCES[0], version="bad")] + INSTANCES
    source = _as_official_parquet(tmp_path / "in.parquet", rows)
    proc = _script("--local-save-dir", str(tmp_path), "--input", str(source), "--max-instances", "4",
                   "--deployment", "modal")
    assert proc.returncode == 0, proc.stderr
    assert [r["instance_id"] for r in read_rows(tmp_path / "swe_bench_verified_modal.parquet")] == IDS[:4]


def test_without_input_the_hub_is_tried_and_failure_is_explained(tmp_path):
    proc = _script("--local-save-dir", str(tmp_path), env={"HF_HUB_OFFLINE": "1", "DEPLOYMENT": "docker"})
    assert proc.returncode == 2
    assert "could not load princeton-nlp/SWE-bench_Verified (split test) from the Hugging Face hub" in proc.stderr
    assert "--input FILE" in proc.stderr
    assert not list(tmp_path.iterdir())


def test_bad_inputs_fail_clearly(tmp_path):
    proc = _script("--local-save-dir", str(tmp_path), "--input", str(tmp_path / "nope.parquet"))
    assert proc.returncode == 2 and "input file not found" in proc.stderr
    (tmp_path / "x.csv").write_text("a,b\n")
    proc = _script("--local-save-dir", str(tmp_path), "--input", str(tmp_path / "x.csv"))
    assert proc.returncode == 2 and "unsupported input format .csv" in proc.stderr
    (tmp_path / "all_bad.jsonl").write_text(json.dumps({"instance_id": "a__b-1"}) + "\n")
    proc = _script("--local-save-dir", str(tmp_path), "--input", str(tmp_path / "all_bad.jsonl"))
    assert proc.returncode == 2 and "no valid instances" in proc.stderr and "row 0 (instance_id=a__b-1)" in proc.stderr
    proc = _script("--local-save-dir", str(tmp_path), "--input", str(FIXTURES / "instances.jsonl"),
                   env={"DEPLOYMENT": "kubernetes"})
    assert proc.returncode == 2 and "unknown deployment 'kubernetes'" in proc.stderr


def test_the_cli_subcommand_is_the_same_command(tmp_path):
    from uni_agent.cli import main

    assert main(["preprocess-swe", "--local-save-dir", str(tmp_path), "--input", str(FIXTURES / "instances.jsonl"),
                 "--deployment", "docker", "--max-instances", "2"]) == 0
    assert len(read_rows(tmp_path / "swe_bench_verified_docker.parquet")) == 2


@pytest.mark.parametrize("deployment, config", [("podman", "agent_config_podman.yaml"),
                                                ("docker", "agent_config_podman.yaml"),
                                                ("modal", "agent_config_modal.yaml")])
def test_rows_validate_against_the_backend_agent_configs(tmp_path, deployment, config):
    """What docs/datasets.md tells users to run: preprocessed rows with the example agent config of their backend."""
    yaml_path = REPO_ROOT / "examples" / "agent_interaction" / config
    assert yaml_path.exists(), f"{config} is missing from examples/agent_interaction"
    path, _, _ = preprocess(tmp_path, FIXTURES / "instances.jsonl", deployment)
    specs, problems = build_specs(read_rows(path), AgentConfigs.load(yaml_path), "run", 1, str(path))
    assert not problems, problems[:1]
    deployment_config = specs[0].agent.env.deployment
    assert deployment_config.type == deployment and deployment_config.workdir == "/testbed"
    assert deployment_config.image == "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907"
