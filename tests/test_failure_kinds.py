"""Failure kinds (none / model / infra), `--retry-errors`, and the run manifest (run.json).

Real processes: the session's LocalCluster, real bubblewrap sandboxes, real Parquet, and a ScriptedLLM (a real
OpenAI-compatible HTTP server, uni_agent/testing/scripted_llm.py) whose policy injects the LLM faults; the sandbox
fault is a real one (the sandbox's directory removed under a running rollout)."""

import json
import threading
from collections import Counter

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import AGENT_CONFIG, assistant_turns
from uni_agent import AgentConfigs, run
from uni_agent.episode.failures import classify, infra
from uni_agent.driver.manifest import differences
from uni_agent.reports.run_report import render_report
from uni_agent.driver.results import ResultStore
from uni_agent.episode.rollout import RolloutResult
from uni_agent.sandbox.leftovers import remove_sandbox_dir
from uni_agent.sandbox.local import sandbox_root
from uni_agent.driver.summary import summarize
from uni_agent.tasks.swe_form import BUNDLED_DIR
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM, tool_call_message
from uni_agent.grading import Verification

STATEMENTS = {i["instance_id"]: i["problem_statement"].strip()
              for i in (json.loads(p.read_text()) for p in BUNDLED_DIR.glob("*/instance.json"))}


def _result(**fields) -> RolloutResult:
    return RolloutResult(**{"run_id": "r", "instance_id": "t", "rollout": 0, "data_source": "d", "agent_name": "a",
                            "exit_reason": "submitted", **fields})


# -- classification -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "status", "error", "kind", "cause"), [
    ({"resolved": True, "reward": 1.0}, "resolved", None, "none", None),
    ({}, "unresolved", None, "model", "unresolved"),
    ({}, "patch_failed", None, "model", "verification patch_failed"),
    ({}, "timeout", "verification ran past 300s", "model", "verification timeout"),
    ({}, "error", "RuntimeError: the test patch did not apply", "infra",
     "verification: RuntimeError: the test patch did not apply"),
    ({"exit_reason": "max_turns"}, "unresolved", None, "model", "max_turns"),
    ({"exit_reason": "context_limit"}, None, None, "model", "context_limit"),
    ({"exit_reason": "command_timeouts"}, "unresolved", None, "model", "command_timeouts"),
    ({"exit_reason": "wall_clock"}, "unresolved", None, "model", "wall_clock"),
    ({"exit_reason": "error", "error": "boom"}, None, None, "infra", "agent: boom"),
    ({}, None, None, "none", "not verified"),
    ({}, "resolve", None, "infra", "verification: unknown verification status 'resolve'"),  # a grader's typo
])
def test_classification(fields, status, error, kind, cause):
    result = _result(**fields)
    if status is not None:
        result.record(Verification(status=status, error=error, resolved=status == "resolved",
                                   reward=1.0 if status == "resolved" else 0.0))
    classify(result)
    assert (result.failure_kind, result.failure_cause) == (kind, cause)


def test_the_driver_bound_on_a_verification_is_told_apart_from_a_slow_test_by_its_type_not_its_text():
    from uni_agent.verification import no_result

    lost, slow, worded_alike = _result(), _result(), _result()
    lost.record(no_result(900))
    slow.record(Verification(status="timeout", error="verification ran past 300s"))
    worded_alike.record(Verification(status="timeout", error="no verification result within 900 s"))  # a grader's
    assert (lost.failure_kind, slow.failure_kind, worded_alike.failure_kind) == ("infra", "model", "model")
    assert lost.failure_cause == "verification: no verification result within 900 s"


def test_an_infra_failure_stays_infra_whatever_the_grade():
    result = _result(exit_reason="error")
    infra(result, "sandbox", "SandboxError: gone")
    result.record(Verification(status="unresolved"))
    classify(result)
    assert (result.failure_kind, result.failure_cause) == ("infra", "sandbox: SandboxError: gone")


def test_summary_counts_infra_failures_apart():
    frame = pd.DataFrame([
        {"instance_id": "a", "rollout": 0, "reward": 1.0, "exit_reason": "submitted", "error": None,
         "failure_kind": "none", "failure_cause": None},
        {"instance_id": "a", "rollout": 1, "reward": 0.0, "exit_reason": "error", "error": "x",
         "failure_kind": "infra", "failure_cause": "llm: HTTP 500"},
        {"instance_id": "b", "rollout": 0, "reward": 0.0, "exit_reason": "max_turns", "error": None,
         "failure_kind": "model", "failure_cause": "max_turns"},
        {"instance_id": "b", "rollout": 1, "reward": 0.0, "exit_reason": "error", "error": "y",
         "failure_kind": "infra", "failure_cause": "sandbox: gone"},
    ])
    for col in ("sandbox_start_s", "llm_s", "tools_s", "verify_s", "total_s"):
        frame[col] = 1.0
    summary = summarize(frame, num_tasks=2, n=2, wall_seconds=10)
    assert summary["avg_at_n"] == 0.25  # over all rollouts: an infra failure scores 0 here ...
    assert summary["infra_failures"] == 2  # ... and is counted apart, so it is not read as the model's
    assert summary["avg_at_n_without_infra"] == 0.5
    assert summary["failure_kinds"] == {"none": 1, "model": 1, "infra": 2}
    assert summary["infra_failure_parts"] == {"llm": 1, "sandbox": 1}


# -- the result store ---------------------------------------------------------------------------------------------


def test_store_replaces_a_retried_row_and_reads_one_row_per_key(tmp_path):
    store = ResultStore(tmp_path, flush_every=100)
    store.add(_result(instance_id="a", exit_reason="error", failure_kind="infra", failure_cause="llm: 500"))
    store.add(_result(instance_id="b", failure_kind="model", failure_cause="unresolved", input_ids=[1, 2],
                      loss_mask=[0, 1], logprobs=[0.0, -0.5]))
    store.flush()
    assert store.done_keys(retry_infra=True) == {("b", 0)} and set(store.retrying) == {("a", 0)}
    store.add(_result(instance_id="a", failure_kind="none", resolved=True, reward=1.0))
    store.flush()  # the new row is written, then the old one removed from its part file
    frame = ResultStore(tmp_path).read()
    assert sorted(frame["instance_id"]) == ["a", "b"]
    on_disk = pd.concat(pd.read_parquet(p) for p in (tmp_path / "results").glob("part-*.parquet"))
    assert len(on_disk) == 2  # physically gone, not only hidden
    row = frame.set_index("instance_id").loc["a"]
    attempts = json.loads(row["attempts"])
    assert [a["failure_kind"] for a in attempts] == ["infra"] and attempts[0]["failure_cause"] == "llm: 500"
    assert list(frame.set_index("instance_id").loc["b", "logprobs"]) == [0.0, -0.5]


def test_store_keeps_the_newest_row_when_a_crash_left_both(tmp_path):
    store = ResultStore(tmp_path)
    store.add(_result(instance_id="a", exit_reason="error", failure_kind="infra"))
    store.flush()
    store.add(_result(instance_id="a", failure_kind="none",
                      attempts=[{"failure_kind": "infra"}]))  # written; `supersede` never ran
    store.flush()
    frame = store.read()
    assert len(frame) == 1 and frame.loc[0, "failure_kind"] == "none"
    assert store.supersede({("a", 0)}) == 1 and len(store.read()) == 1


def test_store_reads_part_files_written_before_the_new_columns(tmp_path):
    (tmp_path / "results").mkdir()
    pd.DataFrame([{"run_id": "r", "instance_id": "old", "rollout": 0, "reward": 1.0, "exit_reason": "submitted"}]) \
        .to_parquet(tmp_path / "results" / "part-20250101T000000-old.parquet")
    frame = ResultStore(tmp_path).read()
    assert frame.loc[0, "instance_id"] == "old" and frame.loc[0, "input_ids"] is None
    assert ResultStore(tmp_path).done_keys(retry_infra=True) == {("old", 0)}


# -- the manifest -------------------------------------------------------------------------------------------------


def test_manifest_differences_name_the_fields():
    before = {"settings": {"n": 2, "temperature": 0.8, "output_dir": "a"}, "agents": {"x": {"max_turns": 6}},
              "dataset": {"path": "/a.parquet", "sha256": "1"}, "model": {"sha256": "m", "path": "/m"}}
    after = {"settings": {"n": 2, "temperature": 0.2, "output_dir": "b"}, "agents": {"x": {"max_turns": 8}},
             "dataset": {"path": "/moved.parquet", "sha256": "1"}, "model": {"sha256": "m2", "path": "/m"}}
    assert differences(before, after) == ["settings.temperature", "agents.x.max_turns", "model.sha256"]


# -- the whole path: injected faults, then --retry-errors ---------------------------------------------------------


def test_infra_failures_are_recorded_apart_and_retry_errors_reruns_exactly_them(rows, tmp_path, dask_client, capfd):
    llm_victim, sandbox_victim, model_failure = (rows[i]["instance_id"] for i in range(3))
    chosen = rows[:5]
    faults_on = threading.Event()
    faults_on.set()
    seen: Counter = Counter()
    lock = threading.Lock()

    def instance(body):
        user = next(m["content"] for m in body["messages"] if m["role"] == "user")
        return next(name for name, statement in STATEMENTS.items() if statement in user)

    def policy(body):
        name = instance(body)
        with lock:
            seen[name] += 1
        if faults_on.is_set() and name == llm_victim:
            return Fault(503)  # the endpoint fails every attempt: infra, after the client's retries
        if faults_on.is_set() and name == sandbox_victim and assistant_turns(body) == 1:
            for path in sandbox_root().glob(f"{name}-r0-*"):  # the sandbox dies under the rollout
                remove_sandbox_dir(path)  # overlayfs's work dir too, which an ordinary user's rmtree cannot enter
            return tool_call_message("execute_bash", {"command": "ls"})
        if name == model_failure:
            return tool_call_message("execute_bash", {"command": "echo never submits"})
        if assistant_turns(body) == 0:
            return tool_call_message("execute_bash", {"command": "echo looked"})
        return tool_call_message("submit", {})

    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"interaction": {"tools_in": "api", "constrain_tool_calls": False, "max_turns": 3}})
    common = dict(client=dask_client, engine="external", model_name="scripted", n=1, output_dir=str(tmp_path),
                  progress=False, verify=False, llm_timeout=5)
    with ScriptedLLM(policy) as server:
        first = run(chosen, agents, base_url=server.base_url, **common)
        kinds = first.results.set_index("instance_id")
        assert kinds.loc[llm_victim, "failure_kind"] == "infra"
        assert kinds.loc[llm_victim, "failure_cause"].startswith("llm: TransientLLMError: ")
        assert "HTTP 503" in kinds.loc[llm_victim, "failure_cause"]
        assert kinds.loc[sandbox_victim, "failure_kind"] == "infra"
        assert kinds.loc[sandbox_victim, "failure_cause"].startswith("sandbox: SandboxError: ")
        assert kinds.loc[model_failure, ["failure_kind", "failure_cause"]].tolist() == ["model", "max_turns"]
        others = kinds.drop(index=[llm_victim, sandbox_victim, model_failure])
        assert (others.failure_kind == "none").all() and (others.failure_cause == "not verified").all()
        assert first.summary["infra_failures"] == 2 and first.summary["failure_kinds"]["model"] == 1
        html = render_report(first.results, first.summary)
        assert "infrastructure failures" in html and "sandbox: SandboxError" not in html.split("failing-table")[0]

        # A plain resume runs nothing; --retry-errors runs exactly the two infra rollouts, with the faults gone.
        faults_on.clear()
        seen.clear()
        run(chosen, agents, base_url=server.base_url, **common)
        assert not seen
        capfd.readouterr()
        second = run(chosen, agents, base_url=server.base_url, retry_errors=True, temperature=0.2, **common)
        assert set(seen) == {llm_victim, sandbox_victim}
    err = capfd.readouterr().err
    assert "5 rollouts (3 already done" in err and "2 of them infra failures run again" in err
    assert "this resumed run differs in: settings.temperature" in err

    results = second.results.set_index("instance_id")
    assert len(second.results) == 5 and results.index.is_unique
    for name in (llm_victim, sandbox_victim):
        assert results.loc[name, "failure_kind"] == "none" and results.loc[name, "exit_reason"] == "submitted"
        history = json.loads(results.loc[name, "attempts"])
        assert len(history) == 1 and history[0]["failure_kind"] == "infra" and history[0]["exit_reason"] == "error"
    assert results.loc[model_failure, "failure_kind"] == "model"  # a model failure is a result: not re-run
    on_disk = pd.concat(pq.read_table(p).to_pandas() for p in (tmp_path / "results").glob("part-*.parquet"))
    assert len(on_disk) == 5 and not on_disk.duplicated(["instance_id", "rollout"]).any()
    assert second.summary["infra_failures"] == 0

    manifest = json.loads((tmp_path / "run.json").read_text())
    assert manifest["run_id"] == second.summary["run_id"]
    assert manifest["settings"]["temperature"] == 0.8  # the first session's inputs at the top ...
    assert [s["inputs"]["settings"]["temperature"] for s in manifest["sessions"][1:]] == [0.8, 0.2]  # ... then each
    assert manifest["sessions"][2]["differs"] == ["settings.temperature"]
    assert all(s["started_at"] and s["finished_at"] for s in manifest["sessions"])
    assert manifest["sessions"][0]["versions"]["distributed"] and manifest["sessions"][0]["git"]["commit"]
    assert manifest["dataset"]["rows"] == 5 and len(manifest["dataset"]["sha256"]) == 64
    assert manifest["agents"]["swe_agent"]["interaction"]["max_turns"] == 3
    assert manifest["rollout_configs"]["count"] == 5
    configs = [json.loads(line) for line in (tmp_path / "configs.jsonl").read_text().splitlines()]
    assert {c["instance_id"] for c in configs} == {r["instance_id"] for r in chosen}
    assert all(c["agent"]["env"]["deployment"]["repo"] for c in configs)  # the row's tools_kwargs merged in
    assert manifest["sessions"][0]["token_capture"] is None  # external endpoint: off, said once


def test_cli_flags_reach_the_settings():
    from uni_agent.cli import build_parser, settings_from

    settings = settings_from(build_parser().parse_args(["run", "--retry-errors", "--token-capture", "vllm"]))
    assert settings.retry_errors is True and settings.token_capture == "vllm"
    default = settings_from(build_parser().parse_args(["run"]))
    assert default.retry_errors is False and default.token_capture == "auto"


def test_a_run_that_is_mostly_infra_failures_exits_non_zero_and_says_why(rows, tmp_path, dask_client, capfd):
    """The endpoint fails every call (HTTP 503 after the client's retries): every rollout is an infra failure, so
    the CLI exits 3 naming the share and the part that broke; a run where the model merely fails exits 0."""
    from uni_agent.cli import INFRA_OUTAGE_EXIT, main
    from uni_agent.tasks.swe_form import convert

    data = tmp_path / "rows.parquet"
    convert(None, data)
    argv = ["run", "--data-path", str(data), "--agent-config-path", str(AGENT_CONFIG), "--max-samples", "2",
            "--n", "1", "--max-turns", "2", "--engine", "external", "--model", "scripted", "--no-verify",
            "--no-progress", "--scheduler-address", dask_client.scheduler.address]
    with ScriptedLLM(lambda body: Fault(503)) as server:
        code = main([*argv, "--base-url", server.base_url, "--output-dir", str(tmp_path / "down")])
    err = capfd.readouterr().err
    assert code == INFRA_OUTAGE_EXIT, err[-3000:]
    assert "error: 2 of 2 rollouts failed for infrastructure reasons (llm: 2)" in err

    with ScriptedLLM(lambda body: tool_call_message("execute_bash", {"command": "true"})) as server:
        code = main([*argv, "--base-url", server.base_url, "--output-dir", str(tmp_path / "up")])
    err = capfd.readouterr().err
    assert code == 0, err[-3000:]
    assert "infrastructure reasons" not in err
