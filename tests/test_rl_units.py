"""The RL trainer's parts that need no engine: GRPO advantages and loss (torch), the version audit, and the
setting-edit task family (its gold patch passes the hidden tests, the base fails them, a wrong edit fails)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest

from uni_agent.tasks.setting_edits import HELDOUT_NAMES, LEVELS, TRAIN_NAMES, task_rows, write_tasks
from uni_agent.training.version_audit import audit_versions

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid", "-c", "commit.gpgsign=false"]


def test_group_advantages_are_relative_to_the_group():
    from uni_agent.training.grpo import group_advantages

    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-4)
    assert group_advantages([1.0, 1.0, 1.0]) == [0.0, 0.0, 0.0]  # nothing to learn from a uniform group
    assert group_advantages([1.0, 0.0], scale=False) == [0.5, -0.5]


def test_clipped_loss_stops_the_gradient_past_the_clip_and_weights_by_the_sampler_gap():
    torch = pytest.importorskip("torch", reason="the train extra (torch) is not installed")
    from uni_agent.training.grpo import clipped_policy_loss

    old = torch.zeros(1, 3)
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    # token 1: ratio e^0.5 = 1.65 > 1.28 with a positive advantage: clipped, no gradient; token 2: ratio 1, gradient
    new = torch.tensor([[0.0, 0.5, 0.0]], requires_grad=True)
    loss, stats = clipped_policy_loss(new, old, torch.tensor([1.0]), mask)
    loss.backward()
    assert new.grad[0, 1] == 0 and new.grad[0, 2] == pytest.approx(-0.5)  # -1/2 tokens
    assert stats["clip_fraction"] == pytest.approx(0.5)
    # a sampler that gave the token a lower logprob than the trainer: weight exp(old - sampler), capped at 2
    sampler = torch.tensor([[0.0, math.nan, -0.1]])
    new2 = torch.zeros(1, 3, requires_grad=True)
    loss2, stats2 = clipped_policy_loss(new2, old, torch.tensor([1.0]), mask, sampler_logprobs=sampler)
    loss2.backward()
    assert new2.grad[0, 2] == pytest.approx(-0.5 * math.exp(0.1), rel=1e-5)
    assert new2.grad[0, 1] == pytest.approx(-0.5)  # no sampler logprob (NaN): weight 1
    far = torch.tensor([[0.0, -5.0, -5.0]])
    _, capped = clipped_policy_loss(torch.zeros(1, 3), old, torch.tensor([1.0]), mask, sampler_logprobs=far)
    assert capped["tis_weight_mean"] == pytest.approx(2.0)


def test_logprob_gap_counts_only_reported_sampled_tokens():
    torch = pytest.importorskip("torch", reason="the train extra (torch) is not installed")
    from uni_agent.training.grpo import logprob_gap

    sampler = torch.tensor([-1.0, math.nan, -2.0, -3.0])
    trainer = torch.tensor([-1.5, -1.0, -2.0, -9.0])
    gap = logprob_gap(sampler, trainer, torch.tensor([1, 1, 1, 0]))
    assert gap["tokens"] == 2 and gap["abs_mean"] == pytest.approx(0.25) and gap["mean"] == pytest.approx(0.25)


def _row(versions, asked, vmin=None, vmax=None, action=None):
    sampled = [v for v in versions if v >= 0]
    return {"instance_id": "t", "rollout": 0, "token_versions": versions, "policy_version": asked,
            "version_min": min(sampled) if vmin is None else vmin,
            "version_max": max(sampled) if vmax is None else vmax,
            "staleness_action": action}


def test_version_audit_accepts_a_rollout_spanning_an_update_and_flags_the_impossible():
    good = [_row([-1, 3, 3, -1, 4, 4], asked=3), _row([-1, 4, 4], asked=4)]
    audit = audit_versions(good, current_version=4, max_staleness=1)
    assert audit["inconsistent"] == 0 and audit["spanning"] == 1 and audit["tokens_per_version"] == {3: 2, 4: 4}
    bad = [_row([-1, 4, 3], asked=3),  # goes back
           _row([-1, 2, 2], asked=3),  # older than asked
           _row([-1, 5], asked=4),  # a version that never served
           _row([-1, 3, 4], asked=3, vmin=4)]  # bounds that do not match the tokens
    audit = audit_versions(bad, current_version=4, max_staleness=1)
    assert audit["inconsistent"] == 4, audit["problems"]
    assert audit_versions([_row([-1, 1], asked=1)], current_version=3, max_staleness=1)["stale_unmasked"] == 1


def test_setting_tasks_are_reproducible_split_and_graded_by_their_tests(tmp_path):
    train = write_tasks(tmp_path / "train", "train", 6, seed=1)
    again = write_tasks(tmp_path / "again", "train", 6, seed=1)
    heldout = write_tasks(tmp_path / "heldout", "heldout", 3, seed=1)
    assert [(t / "instance.json").read_text() for t in train] == [(t / "instance.json").read_text() for t in again]
    instances = [json.loads((t / "instance.json").read_text()) for t in train + heldout]
    assert {i["level"] for i in instances} == set(LEVELS)

    def names(tasks):
        return {json.loads((t / "instance.json").read_text())["FAIL_TO_PASS"][0].split("test_")[-1].upper()
                for t in tasks}
    assert names(train) <= set(TRAIN_NAMES) and names(heldout) <= set(HELDOUT_NAMES)
    rows = task_rows(train[:3])
    assert [r["prompt"][1]["content"] for r in rows] == [i["problem_statement"] for i in instances[:3]]
    for task, instance in zip(train[:3], instances[:3], strict=True):
        assert _outcome(tmp_path, task, instance, None) == (False, True)  # the base: target fails, others pass
        assert _outcome(tmp_path, task, instance, instance["patch"]) == (True, True)
        name = instance["FAIL_TO_PASS"][0].split("test_")[-1].upper()
        wrong = (task / "repo" / "settings.py").read_text().replace(f"{name} =", f"{name} = 1 +", 1)
        assert _outcome(tmp_path, task, instance, None, settings=wrong)[0] is False


def _outcome(tmp_path, task, instance, patch, settings=None):
    """(target test passed, other settings' test passed) after the hidden test patch and `patch` or `settings`."""
    work = tmp_path / f"work-{task.name}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(task / "repo", work)
    subprocess.run([*GIT, "init", "-q"], cwd=work, check=True)
    for name, diff in (("test.patch", instance["test_patch"]), ("gold.patch", patch)):
        if diff:
            (tmp_path / name).write_text(diff)
            subprocess.run([*GIT, "apply", str(tmp_path / name)], cwd=work, check=True)
    if settings is not None:
        (work / "settings.py").write_text(settings)
    ran = subprocess.run([sys.executable, "-m", "pytest", "-rA", "-q", "-p", "no:cacheprovider"], cwd=work,
                         capture_output=True, text=True)
    passed = {line.split()[1] for line in ran.stdout.splitlines() if line.startswith("PASSED ")}
    return instance["FAIL_TO_PASS"][0] in passed, instance["PASS_TO_PASS"][0] in passed
