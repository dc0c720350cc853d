"""One dataset row in the seed schema, as every task source writes it (bundled SWE-form tasks, SWE-bench and its
kin, SWE-smith, Terminal-Bench). Depends on nothing else in the package, so any preprocessor can use it."""

from __future__ import annotations

from typing import Any


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
