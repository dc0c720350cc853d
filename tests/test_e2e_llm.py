"""End to end with the real model: llama.cpp's llama-server (a subprocess owned by a Dask actor) serving
SmolLM2-135M-Instruct, real sandboxes, real verification. The tiny model proves the path, not a score."""

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import AGENT_CONFIG, _cmd
from uni_agent import run
from uni_agent.engines.llama_build import binary_path

pytestmark = pytest.mark.llm
SERVER = binary_path("cpu")


def _llama_servers() -> dict[str, str]:
    """pid -> command line of every llama-server on the machine (other runs' too: the test compares before/after)."""
    return {p.name: c for p in Path("/proc").iterdir() if p.name.isdigit() and str(SERVER) in (c := _cmd(p))}


def test_real_model_rollouts_end_to_end(tmp_path, dask_client):
    before = _llama_servers()
    run(None, AGENT_CONFIG, client=dask_client, engine="llama_cpp", n=1, max_samples=3, max_turns=3,
                  max_tokens=128, output_dir=str(tmp_path), progress=False)
    results = pd.read_parquet(tmp_path / "results")
    assert len(results) == 3 and set(results.rollout) == {0}
    assert set(results.exit_reason) <= {"submitted", "max_turns", "context_limit", "command_timeouts", "wall_clock"}, \
        results[["exit_reason", "error"]].to_dict("records")
    assert (results.num_turns >= 1).all()
    assert (results.completion_tokens > 0).all() and (results.llm_s > 0).all()
    for row in results.itertuples():
        messages = json.loads(row.messages)
        replies = [m for m in messages if m["role"] == "assistant"]
        assert replies and any(m["content"].strip() for m in replies)  # text the model actually generated
        assert json.loads(row.verification)["status"] in ("resolved", "unresolved", "patch_failed")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_rollouts"] == 3 and summary["n"] == 1
    log = (tmp_path / "logs" / "engine-0.log").read_text()
    assert "listening on http" in log and "n_slots = 8" in log, log[-2000:]
    left = {pid: cmd for pid, cmd in _llama_servers().items() if pid not in before}
    assert not left, f"the engine process outlived the run: {left}"
