"""Trainer formats (uni_agent.training.formats): verl's agent-loop output and a padded batch, checked for their
semantics on sequences built the way rows are built (uni_agent trajectory) and on REAL rows from a run with
llama-server and SmolLM2 (marked llm)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from uni_agent.episode.trajectory import TurnTokens, build_sequence
from uni_agent.training.formats import RowFormatError, padded_batch, verl_agent_loop_outputs

MESSAGES = '[{"role":"system","content":"s"},{"role":"user","content":"u"},{"role":"assistant","content":"a"},' \
           '{"role":"tool","content":"t"},{"role":"assistant","content":"b"}]'


def _row(turns: list[TurnTokens], **extra) -> dict:
    seq = build_sequence(turns)
    return {"instance_id": "task", "rollout": 0, "input_ids": seq.input_ids, "loss_mask": seq.loss_mask,
            "logprobs": seq.logprobs, "reward": 1.0, "num_turns": len(turns), "messages": MESSAGES, **extra}


TWO_TURNS = [TurnTokens([1, 2, 3], [10, 11], [-0.5, -0.25]),
             TurnTokens([1, 2, 3, 10, 11, 20, 21], [12, 13], [-0.125, float("nan")])]


def test_split_at_the_first_sampled_token_with_mask_and_logprobs_aligned() -> None:
    out = verl_agent_loop_outputs([_row(TWO_TURNS)])[0]
    assert out["prompt_ids"] == [1, 2, 3]
    assert out["response_ids"] == [10, 11, 20, 21, 12, 13]
    assert out["response_mask"] == [1, 1, 0, 0, 1, 1]  # the tool output (20, 21) is not trained on
    assert out["response_logprobs"][:5] == [-0.5, -0.25, 0.0, 0.0, -0.125] and math.isnan(out["response_logprobs"][5])
    assert out["reward_score"] == 1.0 and out["num_turns"] == 4 and out["extra_fields"]["agent_turns"] == 2


def test_a_masked_row_splits_by_its_token_versions() -> None:
    row = _row(TWO_TURNS, masked=True)
    row["loss_mask"] = [0] * len(row["loss_mask"])
    with pytest.raises(RowFormatError, match="task rollout 0: no sampled token"):
        verl_agent_loop_outputs([row])
    row["token_versions"] = [-1, -1, -1, 3, 3, -1, -1, 4, 4]
    out = verl_agent_loop_outputs([row])[0]
    assert out["prompt_ids"] == [1, 2, 3] and out["response_mask"] == [0] * 6
    assert out["extra_fields"]["response_versions"] == [3, 3, -1, -1, 4, 4]


def test_rows_that_cannot_train_are_named_or_dropped() -> None:
    empty = {"instance_id": "x", "rollout": 2, "input_ids": [], "loss_mask": [], "logprobs": [],
             "tokens_missing": "turn 1: no logprobs"}
    with pytest.raises(RowFormatError, match="row x rollout 2: no token ids \\(turn 1: no logprobs\\)"):
        verl_agent_loop_outputs([empty])
    assert len(verl_agent_loop_outputs([empty, _row(TWO_TURNS)], drop_unusable=True)) == 1
    bad = _row(TWO_TURNS)
    bad["logprobs"] = bad["logprobs"][:-1]
    with pytest.raises(RowFormatError, match="different lengths"):
        verl_agent_loop_outputs([bad])


def test_padded_batch_layout() -> None:
    short = _row([TurnTokens([5], [6], [-1.0])], token_versions=[-1, 7])
    batch = padded_batch([_row(TWO_TURNS), short], pad_id=0)
    assert batch["prompts"].tolist() == [[1, 2, 3], [0, 0, 5]]  # left-padded
    assert batch["responses"].tolist() == [[10, 11, 20, 21, 12, 13], [6, 0, 0, 0, 0, 0]]  # right-padded
    assert batch["response_mask"].tolist()[1] == [1, 0, 0, 0, 0, 0]
    assert batch["attention_mask"].tolist()[1] == [0, 0, 1, 1, 0, 0, 0, 0, 0]
    assert batch["position_ids"].tolist()[1] == [0, 0, 0, 1, 1, 1, 1, 1, 1]
    assert batch["token_versions"].tolist()[1] == [7, -1, -1, -1, -1, -1]
    assert batch["input_ids"].shape == (2, 9) and batch["rollout_log_probs"].dtype == np.float32
    with pytest.raises(RowFormatError, match="task rollout 0: 6 response_ids, more than 4"):
        padded_batch([_row(TWO_TURNS)], pad_id=0, max_response=4)


@pytest.mark.llm
def test_formats_on_real_rows(real_rows) -> None:
    """Rows of a real run (llama-server, SmolLM2, bundled tasks): the split, the mask and the logprobs hold."""
    usable = real_rows[real_rows["input_ids"].map(len) > 0]
    assert len(usable) >= 1, real_rows[["tokens_missing", "error"]].to_dict("records")
    outputs = verl_agent_loop_outputs(usable)
    for row, out in zip(usable.to_dict("records"), outputs, strict=True):
        first = len(out["prompt_ids"])
        assert list(row["input_ids"]) == out["prompt_ids"] + out["response_ids"]
        assert not any(row["loss_mask"][:first]), "a prompt token is marked as trained"
        assert out["response_mask"][0] == 1 or row["masked"], "the response does not start at a sampled token"
        # mask on sampled tokens only: as many 1s as the engine said it sampled (usage's completion tokens)
        if not row["masked"] and row["token_drift"] is None:
            assert sum(out["response_mask"]) == row["completion_tokens"]
        # logprobs aligned: non-zero exactly where the mask is 1, and a real log-probability there
        for m, lp in zip(out["response_mask"], out["response_logprobs"], strict=True):
            assert (m == 1) == (lp != 0.0), (m, lp)
            assert math.isnan(lp) or lp <= 0.0
    batch = padded_batch(usable, pad_id=0)
    assert batch["input_ids"].shape[0] == len(usable)
    for i, row in enumerate(usable.to_dict("records")):  # the real tokens of each line are the row's, in order
        assert batch["input_ids"][i][batch["attention_mask"][i] == 1].tolist() == list(row["input_ids"])


@pytest.fixture(scope="module")
def real_rows(dask_client, tmp_path_factory):
    from conftest import AGENT_CONFIG
    from uni_agent import run

    out = tmp_path_factory.mktemp("formats-run")
    return run(None, AGENT_CONFIG, client=dask_client, engine="llama_cpp", n=2, max_samples=1, max_turns=2,
               max_tokens=96, output_dir=str(out), progress=False).results
