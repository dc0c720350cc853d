"""Agents that bring their own loop: any program that speaks the OpenAI chat API runs as the agent of a rollout, in its
sandbox, behind the agent worker's model gateway (docs/harness.md).

- agent.py: HarnessAgent, an agent strategy (uni_agent.episode.strategy): `_target_: uni_agent.harness.HarnessAgent`
  with a `harness:` block in the agent config;
- gateway.py: the OpenAI-compatible server per agent worker (budgets, function calling, token capture);
- calls.py: what the calls leave in the row (messages, token columns, chains);
- translate.py: function calling for engines that read tools from the prompt;
- prepare.py: `uni-agent harness prepare`, environments to mount (mini-swe-agent).
"""

from .agent import HarnessAgent

__all__ = ["HarnessAgent"]
