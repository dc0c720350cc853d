"""The run summary's pass@k and Avg@N over a results frame (uni_agent.driver.summary), counted by hand here."""

import math

import pandas as pd

from uni_agent.driver.summary import summarize


def test_pass_at_k_counts_each_tasks_rollouts_and_passes():
    # task a: 4 rollouts, 1 passed; task b: 4, 0 passed (one reward missing); task c: 4, all passed
    rewards = {"a": [1.0, 0.0, 0.0, 0.0], "b": [0.0, None, 0.0, 0.0], "c": [1.0, 1.0, 1.0, 1.0]}
    times = dict.fromkeys(("sandbox_start_s", "llm_s", "tools_s", "verify_s", "total_s"), 1.0)
    rows = [{"instance_id": task, "rollout": i, "reward": r, "exit_reason": "submitted", "error": None, **times}
            for task, values in rewards.items() for i, r in enumerate(values)]
    summary = summarize(pd.DataFrame(rows), num_tasks=3, n=4, wall_seconds=10.0)
    pass_1 = (1 / 4 + 0 + 1) / 3  # pass@1 of a task is its share of passed rollouts
    pass_4 = (1 - math.comb(3, 4) / math.comb(4, 4) + 0 + 1) / 3  # a: at least one of 4 passes, for sure
    assert summary["pass@1"] == round(pass_1, 4) and summary["pass@4"] == round(pass_4, 4)
    assert summary["resolved"] == 5 and summary["resolved_instances"] == 2 and summary["num_rollouts"] == 12
