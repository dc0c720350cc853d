"""The seed's path to the agent loop, kept for code and agent YAML files that name it (`_target_:
uni_agent.agent_loop.UniAgentLoop`). The loop lives in uni_agent.episode.agent_loop; config stores that spelling."""

from .episode.agent_loop import UniAgentLoop

__all__ = ["UniAgentLoop"]
