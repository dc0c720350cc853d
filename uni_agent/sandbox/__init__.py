"""Sandboxes: one protocol (base.py) and one module per backend, found by deployment type in `SANDBOXES`."""

from __future__ import annotations

from ..config import DeploymentConfig
from ..registry import Registry
from .base import ExecResult, Sandbox, SandboxError, SandboxStartError, clip_output, read_file, write_file

# deployment `type` → backend class, imported on first use so optional SDKs (modal) stay optional. A new backend is a
# module here, a line in this table, and its config class in config.DeploymentConfig.
SANDBOXES: Registry[type] = Registry("deployment type", {
    "local": "uni_agent.sandbox.local:LocalSandbox",
    "docker": "uni_agent.sandbox.container:ContainerSandbox",
    "podman": "uni_agent.sandbox.container:ContainerSandbox",
    "modal": "uni_agent.sandbox.modal:ModalSandbox",
    "memory": "uni_agent.sandbox.memory:MemorySandbox",  # the data plane's stand-in for `uni-agent bench --simulate`
})


def make_sandbox(deployment: DeploymentConfig, env_variables: dict[str, str], name: str = "") -> Sandbox:
    """The sandbox for a deployment config (not started)."""
    return SANDBOXES.get(deployment.type)(deployment, env_variables, name=name)


__all__ = ["SANDBOXES", "ExecResult", "Sandbox", "SandboxError", "SandboxStartError", "clip_output", "make_sandbox",
           "read_file", "write_file"]
