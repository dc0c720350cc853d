"""Terminal-Bench 2 on the local backend: preprocessing (bundled tasks and bad folders), the reward contract
(reward.txt, reward.json, missing/unreadable reward files, a broken or slow test.sh), the oracle, and an agent run
end to end.

Real parts throughout: the example scripts in subprocesses, bubblewrap sandboxes, a Dask LocalCluster, and a real
HTTP server (ScriptedLLM) in place of the model. The container backend is in test_terminal_bench_container.py.
"""

from __future__ import annotations

import base64
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

from conftest import AGENT_CONFIG, REPO_ROOT, assistant_turns
from uni_agent import run
from uni_agent.config import AgentConfigs, ConfigError
from uni_agent.driver.dataset import build_specs, read_rows
from uni_agent.terminal_bench import BUNDLED_TASKS_DIR
from uni_agent.terminal_bench.dockerfile import parse_dockerfile
from uni_agent.grading.terminal_bench import RewardFileError, read_reward
from uni_agent.testing.scripted_llm import ScriptedLLM, tool_call_message
from uni_agent.driver.verify import verify_all

PREPROCESS = REPO_ROOT / "examples" / "data_preprocess" / "terminal_bench_v2.py"
FIXTURES = REPO_ROOT / "tests" / "fixtures" / "terminal_bench"
BUNDLED = sorted(p.name for p in BUNDLED_TASKS_DIR.iterdir() if (p / "task.toml").exists())
HOST_TASKS = [t for t in BUNDLED if t != "use-installed-tool"]  # its Dockerfile RUNs: container only
# What a competent agent types for each bundled task (the ScriptedLLM plays it).
SOLVING_COMMANDS = {
    "hello-file": "echo 'Hello, Terminal-Bench!' > /app/greeting.txt",
    "csv-region-totals": "python3 -c \"import csv,json; t={}\n"
                         "for r in csv.DictReader(open('data/sales.csv')): "
                         "t[r['region']]=t.get(r['region'],0)+float(r['amount'])\n"
                         "json.dump(t, open('totals.json','w'))\"",
    "fix-word-count": "sed -i 's/wc -l/wc -w/' bin/wordcount.sh && bash bin/wordcount.sh bin/wordcount.sh",
    "use-installed-tool": "echo 'terminal bench' | \"$ROT_TOOL\" > /app/encoded.txt",
    "quick-answer": "sleep 60",  # too slow on purpose: the 15 s episode budget of task.toml ends it
}


def preprocess(out: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, str(PREPROCESS), "--local-save-dir", str(out), *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def local_rows(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("tb-local")
    done = preprocess(out, "--deployment", "local")
    assert f"wrote {len(HOST_TASKS)} tasks" in done.stdout
    # The task that needs its image is named, with the reason.
    assert "skipped task use-installed-tool: needs its image" in done.stderr and "RUN mkdir" in done.stderr
    return read_rows(out / "terminal_bench_v2_local.parquet")


def _unpack(b64: str) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(base64.b64decode(b64)), mode="r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_rows_carry_image_workdir_timeouts_resources_and_hidden_tests(local_rows, tmp_path):
    preprocess(tmp_path, "--deployment", "podman")
    podman_rows = {r["instance_id"]: r for r in read_rows(tmp_path / "terminal_bench_v2_podman.parquet")}
    assert sorted(podman_rows) == BUNDLED
    csv_row = podman_rows["csv-region-totals"]
    kwargs = csv_row["extra_info"]["tools_kwargs"]
    deployment = kwargs["env"]["deployment"]
    assert deployment["type"] == "podman"
    assert deployment["image"].startswith("localhost/uni-agent-tb-csv-region-totals:")
    assert deployment["pull"] == "never" and deployment["network"] == "none"  # built here; allow_internet = false
    assert deployment["workdir"] == "/app" and deployment["cpus"] == 1.0 and deployment["memory"] == "1024m"  # "1G"
    assert kwargs["interaction"]["episode_timeout"] == 300.0  # [agent] timeout_sec: the whole episode
    reward = kwargs["reward"]
    assert reward["name"] == "terminal_bench" and reward["eval_timeout"] == 60.0  # [verifier] timeout_sec
    meta = reward["metadata"]
    assert (meta["agent_timeout_sec"], meta["verifier_timeout_sec"], meta["build_timeout_sec"]) == (300, 60, 300)
    assert json.loads(meta["verifier_env"]) == {"EXPECTED_REGIONS": "4"}
    assert deployment["runtime_timeout"] >= 300 and deployment["deployment_timeout"] >= 360
    # Tests and solution are packed into the row, byte for byte, and nowhere the agent can see them.
    task_dir = BUNDLED_TASKS_DIR / "csv-region-totals"
    assert _unpack(meta["tests_archive"]) == {p.name: p.read_bytes() for p in (task_dir / "tests").iterdir()}
    assert _unpack(meta["solution_archive"])["solve.sh"] == (task_dir / "solution" / "solve.sh").read_bytes()
    system, user = csv_row["prompt"]
    instruction = (task_dir / "instruction.md").read_text().strip()
    assert instruction in user["content"] and "/app" in user["content"]
    assert "check_totals" not in user["content"] + system["content"] and "totals.json\", \"w\"" not in user["content"]
    assert podman_rows["quick-answer"]["extra_info"]["tools_kwargs"]["interaction"]["episode_timeout"] == 15.0
    # The same tasks for the local backend: a workspace made from the Dockerfile's COPYs, ENV carried over.
    local = {r["instance_id"]: r for r in local_rows}
    assert sorted(local) == HOST_TASKS
    wc_env = local["fix-word-count"]["extra_info"]["tools_kwargs"]["env"]
    assert wc_env["env_variables"] == {"WORDCOUNT_HOME": "/app"}
    workspace = Path(wc_env["deployment"]["repo"])
    assert (workspace / "bin" / "wordcount.sh").read_text().endswith("wc -l < \"$1\"\n")
    assert not (workspace / "tests").exists() and wc_env["deployment"]["type"] == "local"
    # Every row is valid for its backend's agent config.
    for rows, config in ((local_rows, AGENT_CONFIG), (list(podman_rows.values()),
                                                      AGENT_CONFIG.with_name("agent_config_podman.yaml"))):
        specs, problems = build_specs(rows, AgentConfigs.load(config), "check", 1)
        assert not problems and len(specs) == len(rows)
        assert all(s.agent.interaction.episode_timeout == rows[i]["extra_info"]["tools_kwargs"]["interaction"][
            "episode_timeout"] for i, s in enumerate(specs))


def test_bad_task_folders_are_reported_by_name_and_field(tmp_path):
    done = preprocess(tmp_path, "--tasks-dir", str(FIXTURES), "--deployment", "local")
    skipped = {line.split()[2].rstrip(":"): line for line in done.stderr.splitlines() if line.startswith("skipped")}
    assert sorted(skipped) == sorted(p.name for p in FIXTURES.iterdir() if p.name.startswith("bad-"))
    assert "no instruction.md" in skipped["bad-no-instruction"]
    assert "task.toml: agent.timeout_sec: Input should be a valid number" in skipped["bad-timeout-type"]
    assert "task.toml is not valid TOML" in skipped["bad-toml-syntax"]
    assert "no tests/test.sh" in skipped["bad-no-test-script"]
    assert "no WORKDIR" in skipped["bad-no-workdir"]
    good = read_rows(tmp_path / "terminal_bench_v2_local.parquet")
    assert sorted(r["instance_id"] for r in good) == sorted(p.name for p in FIXTURES.iterdir()
                                                            if not p.name.startswith("bad-"))
    # Nothing usable at all is an error (exit 2), not an empty file.
    only_bad = tmp_path / "only-bad"
    only_bad.mkdir()
    (only_bad / "bad-no-instruction").symlink_to(FIXTURES / "bad-no-instruction")
    failed = subprocess.run([sys.executable, str(PREPROCESS), "--tasks-dir", str(only_bad), "--local-save-dir",
                             str(tmp_path / "none")], capture_output=True, text=True, cwd=REPO_ROOT)
    assert failed.returncode == 2 and "bad-no-instruction: no instruction.md" in failed.stderr


def test_reward_files_are_read_by_the_contract():
    assert read_reward({"reward.txt": b" 0.75\n"}, 0).value == 0.75
    txt_first = read_reward({"reward.txt": b"1", "reward.json": b'{"reward": 0}'}, 0)
    assert (txt_first.value, txt_first.source) == (1.0, "reward.txt")
    several = read_reward({"reward.json": b'{"reward": 0.5, "speed": 1}'}, 0)
    assert (several.value, several.source, several.metrics) == (0.5, "reward.json", {"reward": 0.5, "speed": 1.0})
    assert read_reward({"reward.json": b'{"score": 0.25}'}, 0).value == 0.25  # a single metric is the reward
    for files, message in [
        ({}, "reward file missing: /logs/verifier/reward.txt (and no reward.json); test.sh exited 3"),
        ({"reward.txt": b"\n"}, "reward file empty: /logs/verifier/reward.txt"),
        ({"reward.txt": b"passed"}, "/logs/verifier/reward.txt is not a number: 'passed'"),
        ({"reward.txt": b"nan"}, "is not a finite number"),
        ({"reward.json": b"{oops"}, "/logs/verifier/reward.json is not valid JSON"),
        ({"reward.json": b"[1]"}, "must be a non-empty object of numbers"),
        ({"reward.json": b'{"reward": "high"}'}, "key 'reward' is not a number"),
        ({"reward.json": b'{"a": 1, "b": 0}'}, "several metrics and no 'reward' key (['a', 'b'])"),
    ]:
        with pytest.raises(RewardFileError, match=None) as caught:
            read_reward(files, 3)
        assert message in str(caught.value)


def test_dockerfile_workdir_env_copies_and_what_needs_an_image(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("ARG BASE=x\nFROM ${BASE}\n# comment\nENV A=1 B=\"two words\"\nENV LEGACY some value\n"
                          "WORKDIR /srv\nWORKDIR app\nCOPY --chown=1:1 a.txt \\\n    b.txt ./\n"
                          "COPY [\"d\", \"/srv/app/d\"]\n")
    info = parse_dockerfile(dockerfile)
    assert info.workdir == "/srv/app" and info.host_compatible
    assert info.env == {"A": "1", "B": "two words", "LEGACY": "some value"}
    assert [(c.sources, c.dest) for c in info.copies] == [(("a.txt", "b.txt"), "/srv/app/"), (("d",), "/srv/app/d")]
    dockerfile.write_text("FROM x\nWORKDIR /app\nRUN apt-get install -y jq\nCOPY cfg /etc/cfg\nFROM y\n")
    blockers = parse_dockerfile(dockerfile).host_blockers
    assert len(blockers) == 3 and "RUN apt-get" in blockers[0] and "multi-stage" in blockers[1]
    assert "COPY to /etc/cfg, outside the workdir /app" in blockers[2]
    dockerfile.write_text("FROM x\nWORKDIR /app\nFROBNICATE now\n")
    with pytest.raises(ConfigError, match="unknown Dockerfile instruction 'FROBNICATE'"):
        parse_dockerfile(dockerfile)


def _verifications(outcome) -> dict[str, dict]:
    return {r["instance_id"]: {**r, **json.loads(r["verification"])} for r in outcome.results.to_dict("records")}


def test_oracle_earns_one_and_empty_zero_on_the_local_backend(local_rows, tmp_path, dask_client):
    address = dask_client.scheduler.address
    oracle = verify_all(local_rows, AGENT_CONFIG, patch="oracle", output_dir=str(tmp_path / "oracle"),
                        scheduler_address=address, progress=False)
    assert oracle.summary["resolved_ids"] == HOST_TASKS and oracle.summary["avg_at_n"] == 1.0
    graded = _verifications(oracle)
    assert graded["csv-region-totals"]["reward_source"] == "reward.json"
    assert graded["csv-region-totals"]["metrics"]["regions_right"] == 1.0
    assert graded["hello-file"]["reward_source"] == "reward.txt"
    assert "greeting found" in graded["hello-file"]["log_tail"]
    empty = verify_all(local_rows, AGENT_CONFIG, patch="empty", output_dir=str(tmp_path / "empty"),
                       scheduler_address=address, progress=False)
    assert empty.summary["resolved"] == 0 and empty.summary["wrong_answer_ids"] == HOST_TASKS
    parquet = pd.read_parquet(tmp_path / "empty" / "verify_empty.parquet")
    assert (parquet.reward == 0.0).all() and (parquet.status == "unresolved").all()


def test_broken_and_slow_verifiers_are_clear_recorded_failures(tmp_path, dask_client):
    preprocess(tmp_path, "--tasks-dir", str(FIXTURES), "--deployment", "local")
    rows = read_rows(tmp_path / "terminal_bench_v2_local.parquet")
    outcome = verify_all(rows, AGENT_CONFIG, patch="oracle", output_dir=str(tmp_path / "oracle"),
                         scheduler_address=dask_client.scheduler.address, progress=False)
    graded = _verifications(outcome)
    assert outcome.summary["timeout_or_error_ids"] == sorted(graded) and outcome.summary["avg_at_n"] == 0.0
    broken = graded["broken-test-script"]
    assert broken["status"] == "error" and broken["reward"] == 0.0
    assert broken["error"] == ("reward file missing: /logs/verifier/reward.txt (and no reward.json); "
                               "test.sh exited 2")
    assert "syntax error" in broken["log_tail"]  # the script's stderr is kept for the reader
    assert "reward.txt is not a number: 'passed'" in graded["reward-not-a-number"]["error"]
    assert "several metrics and no 'reward' key" in graded["json-without-reward-key"]["error"]
    slow = graded["slow-verifier"]
    assert slow["status"] == "timeout" and slow["error"] == "test.sh ran past the verifier timeout of 2s"
    assert slow["verify_s"] < 20  # stopped at its 2 s (+5 s kill grace), not at the sleep's 30 s
    # The same records are in the Parquet file the run leaves.
    parquet = pd.read_parquet(tmp_path / "oracle" / "verify_oracle.parquet").set_index("instance_id")
    assert parquet.loc["broken-test-script", "error"].startswith("reward file missing: /logs/verifier/reward.txt")


def _task_of(body) -> str:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return next(task for task in BUNDLED if (BUNDLED_TASKS_DIR / task / "instruction.md").read_text().strip() in user)


def terminal_agent(body):
    """Runs the task's command, looks at the workdir, then submits."""
    turn = assistant_turns(body)
    if turn == 0:
        return tool_call_message("execute_bash", {"command": SOLVING_COMMANDS[_task_of(body)]})
    if turn == 1:
        return tool_call_message("execute_bash", {"command": "ls -la && git status --short"})
    return tool_call_message("submit", {})


def check_agent_run(outcome, tasks: list[str], out: Path) -> pd.DataFrame:
    results = pd.read_parquet(out / "results").set_index("instance_id")
    assert sorted(results.index) == sorted(tasks)
    solved = [t for t in tasks if t != "quick-answer"]
    assert (results.loc[solved, "reward"] == 1.0).all(), results[["reward", "exit_reason", "error", "verification"]]
    assert (results.loc[solved, "exit_reason"] == "submitted").all() and results.loc[solved, "resolved"].all()
    for task in solved:
        verification = json.loads(results.loc[task, "verification"])
        assert verification["status"] == "resolved" and verification["reward_source"] in ("reward.txt", "reward.json")
    # The whole-episode budget from task.toml ([agent] timeout_sec = 15) ended the slow one mid-command.
    slow = results.loc["quick-answer"]
    assert slow["exit_reason"] == "wall_clock" and "wall-clock budget of 15 s" in slow["error"]
    assert 14 < slow["total_s"] < 40 and slow["reward"] == 0.0
    assert json.loads(slow["verification"])["status"] == "unresolved"  # still graded, as every rollout is
    assert outcome.summary["avg_at_n"] == pytest.approx((len(tasks) - 1) / len(tasks))
    return results


def test_agent_run_end_to_end_on_the_local_backend(local_rows, tmp_path, dask_client):
    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"interaction": {"tools_in": "api", "constrain_tool_calls": False}})
    with ScriptedLLM(terminal_agent) as server:
        outcome = run(local_rows, agents, client=dask_client, engine="external", base_url=server.base_url,
                      model_name="scripted", agent_workers=2, output_dir=str(tmp_path / "out"), progress=False, n=1)
    results = check_agent_run(outcome, HOST_TASKS, tmp_path / "out")
    assert "bin/wordcount.sh" in results.loc["fix-word-count", "patch"]  # the agent's change, graded afresh


SERVICE_TASKS = REPO_ROOT / "tests" / "fixtures" / "terminal_bench_services"


def test_a_service_left_running_is_graded_in_the_agents_own_sandbox(tmp_path, dask_client):
    """The task is graded on a server that must still be running: the oracle's solve.sh starts it in the
    background, and so does the agent in one command; the grader's test.sh, run later in the same sandbox, finds
    it. (A sandbox that ran each command in a process tree of its own lost the server when the command ended.)"""
    preprocess(tmp_path, "--tasks-dir", str(SERVICE_TASKS), "--deployment", "local")
    rows = read_rows(tmp_path / "terminal_bench_v2_local.parquet")
    address = dask_client.scheduler.address
    oracle = verify_all(rows, AGENT_CONFIG, patch="oracle", output_dir=str(tmp_path / "oracle"),
                        scheduler_address=address, progress=False)
    assert oracle.summary["resolved_ids"] == ["serve-status-page"], oracle.summary
    assert "status page answered" in _verifications(oracle)["serve-status-page"]["log_tail"]
    empty = verify_all(rows, AGENT_CONFIG, patch="empty", output_dir=str(tmp_path / "empty"),
                       scheduler_address=address, progress=False)
    assert empty.summary["resolved"] == 0

    start_server = ("mkdir -p /app/site && printf ok > /app/site/status && cd /app/site && "
                    "(python3 -m http.server 8765 --bind 127.0.0.1 > /dev/null 2>&1 &) && sleep 1")

    def agent(body):
        if assistant_turns(body) == 0:
            return tool_call_message("execute_bash", {"command": start_server})
        return tool_call_message("submit", {})

    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"interaction": {"tools_in": "api", "constrain_tool_calls": False}})
    with ScriptedLLM(agent) as server:
        outcome = run(rows, agents, client=dask_client, engine="external", base_url=server.base_url,
                      model_name="scripted", agent_workers=1, output_dir=str(tmp_path / "out"), progress=False, n=1)
    result = outcome.results.set_index("instance_id").loc["serve-status-page"]
    assert result["exit_reason"] == "submitted" and result["reward"] == 1.0, result.to_dict()
