"""Secrets stay secret: a planted API key is searched for in every output of a run (Parquet results, summary.json,
every file under the output dir, per-rollout trajectory files, the dashboard events, the driver's stdout/stderr),
including error messages of an endpoint that echoes the key back. Real LocalCluster, real sandboxes, and a
ScriptedLLM (a real OpenAI-compatible HTTP server, uni_agent/testing/scripted_llm.py).
"""

import json
from pathlib import Path

import pandas as pd

from conftest import AGENT_CONFIG, assistant_turns
from uni_agent import AgentConfigs, run
from uni_agent.driver.dataset import read_rows
from uni_agent.events import unbatch
from uni_agent.redact import redact, register_secret
from uni_agent.tasks.swe_form import BUNDLED_DIR, convert
from uni_agent.testing.scripted_llm import Fault, ScriptedLLM, tool_call_message

# Shaped like no known token, so only the registered-secret redaction (not a pattern) can remove it.
SECRET = "planted-key-5b1d8e0c42aa"
INSTANCES = [json.loads(p.read_text()) for p in sorted(BUNDLED_DIR.glob("*/instance.json"))]


def _instance_index(body) -> int:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return next(i for i, inst in enumerate(INSTANCES) if inst["problem_statement"].strip() in user)


def parquet_text(results_dir: Path) -> str:
    """Every value of every Parquet part file, decoded (the files are compressed: raw bytes would hide it)."""
    frames = [pd.read_parquet(f) for f in sorted(results_dir.glob("*.parquet"))]
    return "\n".join(frame.astype(str).to_csv() for frame in frames)


def test_planted_api_key_appears_in_no_output(tmp_path, dask_client, capfd):
    data = tmp_path / "bundled.parquet"
    convert(None, data)
    rows = read_rows(data)[:4]
    out = tmp_path / "out"
    trajectories = tmp_path / "trajectories"

    def echoing_policy(body):
        auth = body["_headers"].get("Authorization", "")
        index = _instance_index(body)
        if index == 0:  # a 5xx whose body echoes the request's credentials, as some proxies do
            return Fault(500, json.dumps({"error": f"upstream failed for Authorization: {auth}; key={SECRET}"}))
        if index == 1:  # a 4xx echoing the key: not retried, ends the rollout with the body in the error
            return Fault(401, json.dumps({"error": f"invalid api key {SECRET} ({auth})"}))
        if index == 2 and assistant_turns(body) == 0:  # the model repeats the key, and a command prints it
            return tool_call_message("execute_bash", {"command": f"echo the key is {SECRET}"},
                                     content=f"I will use {SECRET}")
        return tool_call_message("submit", {})

    agents = AgentConfigs.load(AGENT_CONFIG).override_all(
        {"log_dir": str(trajectories), "interaction": {"tools_in": "api", "constrain_tool_calls": False}})
    with ScriptedLLM(echoing_policy) as server:
        outcome = run(rows, agents, client=dask_client, engine="external", base_url=server.base_url,
                      model_name="scripted", api_key=SECRET, agent_workers=2, output_dir=str(out), progress=True,
                      log_level="DEBUG")
        # The key really was used: every request carried it.
        assert server.requests and all(r["_headers"].get("Authorization") == f"Bearer {SECRET}"
                                       for r in server.requests)
    captured = capfd.readouterr()
    results = outcome.results.set_index("instance_id")
    first, second = (results.loc[INSTANCES[i]["instance_id"]] for i in (0, 1))
    assert first.exit_reason == "error" and "HTTP 500" in first.error and "***" in first.error
    assert second.exit_reason == "error" and "HTTP 401" in second.error and "***" in second.error
    third = results.loc[INSTANCES[2]["instance_id"]]
    assert third.exit_reason == "submitted" and "the key is ***" in third.messages

    files = [p for p in out.rglob("*") if p.is_file() and p.suffix != ".parquet"]
    files += [p for p in trajectories.rglob("*") if p.is_file()]
    assert (out / "summary.json") in files and any(p.parent == out / "logs" for p in files)
    assert len([p for p in files if p.suffix == ".json" and trajectories in p.parents]) == len(rows)
    outputs = {str(p): p.read_text(errors="replace") for p in files}
    outputs["results parquet"] = parquet_text(out / "results")
    outputs["outcome.results"] = outcome.results.astype(str).to_csv()
    outputs["stdout"], outputs["stderr"] = captured.out, captured.err
    events = [e for _, msg in dask_client.get_events("uni-agent") for e in unbatch(msg)
              if e.get("run_id") == outcome.summary["run_id"]]
    assert events
    outputs["dashboard events"] = json.dumps(events)
    leaked = sorted(name for name, text in outputs.items() if SECRET in text)
    assert not leaked, f"the planted API key appears in: {leaked}"
    assert outputs["results parquet"].count("***") >= 3  # it was there to leak, and was redacted


def test_token_shapes_are_redacted_without_registration():
    text = ("Authorization: Bearer abcDEF123456789xyz modal token ak-1234567890abcdef as-abcdef1234567890 "
            "openai sk-proj-abcdefghijklmnop")
    cleaned = redact(text)
    for secret in ("abcDEF123456789xyz", "ak-1234567890abcdef", "as-abcdef1234567890", "sk-proj-abcdefghijklmnop"):
        assert secret not in cleaned
    register_secret("a-registered-value-1")
    assert redact("x a-registered-value-1 y") == "x *** y"


def test_a_logged_exception_carries_neither_a_secret_nor_its_frames_locals(tmp_path):
    """log.exception (the gateway logs its failed calls so) writes the exception's message and frames: the message
    redacted, the frames without their local variables (a key in a variable, a header, a request)."""
    import structlog

    from uni_agent.logs import configure_logging

    register_secret(SECRET)
    path = configure_logging(tmp_path, "t")

    def call_endpoint(key: str) -> None:
        headers = {"Authorization": f"Token {key}"}
        note = f"headers {headers}"
        raise ValueError(f"http://engine/v1?key={key} refused ({len(note)})")

    try:
        call_endpoint(SECRET)
    except ValueError:
        structlog.get_logger("t").exception("endpoint_call_failed")
    try:  # a group's members are redacted too
        raise ExceptionGroup("calls failed", [ValueError(f"key={SECRET}")])
    except ExceptionGroup:
        structlog.get_logger("t").exception("calls_failed")
    line, group_line = path.read_text().splitlines()
    assert SECRET not in group_line and "key=***" in group_line, group_line
    record = json.loads(line)
    assert SECRET not in line, line
    [exc] = record["exception"]
    assert exc["exc_type"] == "ValueError" and "key=*** refused" in exc["exc_value"]
    assert [f["name"] for f in exc["frames"]][-1] == "call_endpoint"  # the frames are there, their locals not
    assert all("locals" not in f for f in exc["frames"]), exc["frames"]
