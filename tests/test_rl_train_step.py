"""One real gradient step changes what the served model answers: the trainer's own path end to end, on the CPU.

A random 2-layer Llama over SmolLM2's vocabulary (uni_agent.training.policy.tiny_policy) is written as a GGUF by
llama.cpp's converter and served by llama-server through the rollout service; two rollouts of a setting-edit task
come back with their tokens; the trainer takes one GRPO step that rewards the first rollout and penalises the
second (a random model earns no reward of its own, so the test sets the two rewards); the new weights go to the
engine with update_weights. Then, at the sampled positions past where the two answers part, the served model's
logprobs are the trainer's own (F16 against F32), and the rewarded answer's tokens gained on the penalised one's.
(Whether its most likely token changes at those positions is not asserted: at lr 0.01 it often does not, and the
rise already shows the served model is the updated one.)

Needs the `train` extra (torch, transformers): skipped, saying so, where it is not installed."""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("torch", reason="the train extra is not installed (pip install 'uni-agent[train]')")
pytest.importorskip("transformers", reason="the train extra is not installed (pip install 'uni-agent[train]')")

import torch  # noqa: E402

from pathlib import Path  # noqa: E402

from uni_agent.engines.llama_cpp import default_model_path  # noqa: E402
from uni_agent.online import RolloutService  # noqa: E402
from uni_agent.online.loop_thread import LoopThread  # noqa: E402
from uni_agent.tasks.setting_edits import task_rows, write_tasks  # noqa: E402
from uni_agent.training.gguf_export import export_gguf  # noqa: E402
from uni_agent.training.policy import load_tokenizer, tiny_policy  # noqa: E402
from uni_agent.training.trainer import GRPOTrainer, TrainConfig, examples_from_groups  # noqa: E402

pytestmark = pytest.mark.llm
AGENT = Path(__file__).resolve().parents[1] / "examples" / "rl" / "agent_rl.yaml"
POSITIONS = 16


def _served(url: str, key: str | None, ids: list[int], positions: list[int]) -> list[float]:
    """For each i: the served model's logprob of ids[i] after ids[:i] (the token forced by a logit bias; the server
    reports the logprob of the raw model distribution; ignore_eos: an end-of-generation token would end the answer
    unreported)."""
    root = url.removesuffix("/v1")
    logprobs = []
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {key}"} if key else {}) as http:
        for i in positions:
            body = {"prompt": ids[:i], "n_predict": 1, "temperature": 0, "n_probs": 1, "ignore_eos": True}
            forced = http.post(f"{root}/completion", json={**body, "logit_bias": [[ids[i], 100.0]]}).json()
            assert "completion_probabilities" in forced, forced
            assert forced["completion_probabilities"][0]["id"] == ids[i]
            logprobs.append(float(forced["completion_probabilities"][0]["logprob"]))
    return logprobs


def _trainer_logprobs(model, ids: list[int], positions: list[int]) -> list[float]:
    with torch.no_grad():
        logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float(), -1)
    return [float(logprobs[i - 1, ids[i]]) for i in positions]


def test_one_gradient_step_changes_what_the_served_model_answers(dask_client, tmp_path):
    tokenizer = load_tokenizer(default_model_path())
    model = tiny_policy(tokenizer, seed=0)
    v0, v1 = tmp_path / "v0.gguf", tmp_path / "v1.gguf"
    export_gguf(model, tokenizer, v0, work_dir=tmp_path / "hf")
    rows = task_rows(write_tasks(tmp_path / "tasks", "train", 1))
    loop = LoopThread()
    service = loop.run(RolloutService.start(
        AGENT, scheduler_address=dask_client.scheduler.address, output_dir=str(tmp_path / "service"),
        engine="llama_cpp", model_path=str(v0), max_turns=1, max_tokens=32, temperature=1.0, top_p=1.0,
        verify=False, engine_parallel=2, context_length=4096), timeout=600)
    try:
        batch = loop.run(service.submit(rows, n=2), timeout=60)
        groups = loop.run(_groups(batch), timeout=600)
        results = groups[0].results
        assert len(results) == 2 and all(r.version_max == 0 for r in results)
        rewarded, penalised = results
        # Only where the two answers differ is a token rewarded and not also penalised in the same context: the
        # JSON grammar forces the same opening tokens on both (`{"name": ...`), whose two gradients cancel, leaving
        # the step's higher-order noise (a test of those failed one run in two).
        split = next((i for i, (a, b) in enumerate(zip(rewarded.input_ids, penalised.input_ids)) if a != b),
                     min(len(rewarded.input_ids), len(penalised.input_ids)))
        sampled = [i for i, v in enumerate(rewarded.token_versions) if v == 0 and i >= split][:POSITIONS]
        assert len(sampled) >= 8, f"too few sampled tokens past {split}: {rewarded.token_versions}"
        sampled_penalised = [i for i, v in enumerate(penalised.token_versions) if v == 0 and i >= split][:POSITIONS]
        url = service.engines.urls[0]
        before = _served(url, service.engines.api_key, list(rewarded.input_ids), sampled)
        before_penalised = _served(url, service.engines.api_key, list(penalised.input_ids), sampled_penalised)
        results[0].reward, results[1].reward = 1.0, 0.0  # a random model earns nothing: the test hands out reward
        stats = GRPOTrainer(model, TrainConfig(lr=0.01, minibatches=1)).step(examples_from_groups(groups))
        assert stats["optimizer_steps"] == 1 and stats["gap"]["abs_mean"] < 0.05, stats  # served = trained, v0
        export_gguf(model, tokenizer, v1, work_dir=tmp_path / "hf")
        loop.run(service.update_weights(1, str(v1)), timeout=600)
        after = _served(url, service.engines.api_key, list(rewarded.input_ids), sampled)
        after_penalised = _served(url, service.engines.api_key, list(penalised.input_ids), sampled_penalised)
        trained = _trainer_logprobs(model, list(rewarded.input_ids), sampled)
    finally:
        loop.run(service.close(), timeout=300)
        loop.stop()
    rise = sum(x - y for x, y in zip(after, before, strict=True)) / len(sampled)
    rise_penalised = (sum(x - y for x, y in zip(after_penalised, before_penalised, strict=True))
                      / len(sampled_penalised)) if sampled_penalised else 0.0
    moved = sum(abs(x - y) for x, y in zip(trained, before, strict=True)) / len(sampled)
    table = [(round(b, 3), round(a, 3), round(t, 3)) for b, a, t in zip(before, after, trained, strict=True)]
    # First: the engine serves the trained weights (F16 against the trainer's F32: a few hundredths at most), and
    # the step moved them well past that. A served model left on v0 fails here, naming each position.
    assert max(abs(x - y) for x, y in zip(after, trained, strict=True)) < 0.05, ("(before, served, trained)", table)
    assert moved > 0.1, (f"the step moved the rewarded tokens' logprobs by {moved:.3f} on average", table)
    # Then its direction: the rewarded answer's tokens gained on the penalised answer's (past where they part). Both
    # answers' tokens move with the shared weights, and Adam's first step moves every weight by about lr, so the
    # rewarded tokens alone rose 0.40-0.88 in 13 runs here, 0.02 once in CI and -0.08 once (2026-12-07): the step
    # raises the rewarded answer against the penalised one, which is what this asserts (a sign error fails it).
    assert rise - rise_penalised > 0, (f"the rewarded tokens' served logprobs rose by {rise:.3f} on average, the "
                                       f"penalised ones' by {rise_penalised:.3f}", table)


async def _groups(batch):
    return [g async for g in batch.groups()]
