"""uni-agent: parallel LLM coding-agent rollouts in sandboxes on Dask, verified by tests."""

from .config import AgentConfig, AgentConfigs, ConfigError
from .settings import RunSettings


def run(*args, **kwargs):
    """See uni_agent.driver.run.run (imported lazily: Dask is only loaded when a run starts)."""
    from .driver.run import run as _run

    return _run(*args, **kwargs)


__all__ = ["AgentConfig", "AgentConfigs", "ConfigError", "RunSettings", "run"]
