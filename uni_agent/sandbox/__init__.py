"""Sandboxes: one protocol (base.py) and one module per backend. A deployment's config class (config.DEPLOYMENTS, by
`type`) names the backend's class, imported here when a sandbox is made, so optional SDKs (modal) stay optional."""

from __future__ import annotations

from ..config import DeploymentBase
from ..registry import import_object
from .base import ExecResult, Sandbox, SandboxError, SandboxStartError, clip_output, read_file, write_file


def make_sandbox(deployment: DeploymentBase, env_variables: dict[str, str], name: str = "") -> Sandbox:
    """The sandbox for a deployment config (not started), of the class its config class names."""
    sandbox_class = deployment.sandbox_class
    if isinstance(sandbox_class, str):
        sandbox_class = import_object(sandbox_class)
    return sandbox_class(deployment, env_variables, name=name)


__all__ = ["ExecResult", "Sandbox", "SandboxError", "SandboxStartError", "clip_output", "make_sandbox", "read_file",
           "write_file"]
