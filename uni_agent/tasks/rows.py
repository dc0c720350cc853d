"""One dataset row in the seed schema, as every task source writes it (bundled SWE-form tasks, SWE-bench and its
kin, SWE-smith, Terminal-Bench), and the test lists (FAIL_TO_PASS / PASS_TO_PASS) that rows and instances carry, as
every reader takes them. Depends on nothing in the package but ConfigError, so any preprocessor and any grader can
use it."""

from __future__ import annotations

import json
from typing import Any

from ..config import ConfigError


def seed_row(instance_id: str, data_source: str, agent_name: str, system_prompt: str, user_prompt: str,
             env: dict[str, Any], reward: dict[str, Any]) -> dict[str, Any]:
    """One dataset row in the seed schema; `env` and `reward` become extra_info.tools_kwargs (merged over the agent)."""
    return {
        "data_source": data_source,
        "instance_id": instance_id,
        "agent_name": agent_name,
        "prompt": [{"role": "system", "content": system_prompt}, {"role": "user", "content": user_prompt}],
        "extra_info": {"instance_id": instance_id, "tools_kwargs": {"env": env, "reward": reward}},
    }


def test_list(value: Any, field: str = "tests") -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS: a list of test ids, or a JSON string holding one (as the official SWE-bench
    dataset stores them). Every reader of rows and instances goes through here, so a string is never taken for a
    list of its characters; anything else is a ConfigError naming `field` (callers prefix the file or row)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{field} is not a JSON list of test ids (a string that does not parse): {exc}") \
                from None
    if hasattr(value, "tolist"):  # a numpy array from a Parquet list column
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{field} must be a list of test ids or a JSON string of one, got {type(value).__name__}")
    if not all(isinstance(t, str) for t in value):
        raise ConfigError(f"{field} must hold test ids as strings, got {[type(t).__name__ for t in value][:5]}")
    return list(value)
