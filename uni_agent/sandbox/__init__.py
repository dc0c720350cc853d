"""Sandboxes: one protocol (base.py) and one module per backend."""

from __future__ import annotations

from ..config import DeploymentConfig
from .base import ExecResult, Sandbox, SandboxError, SandboxStartError, clip_output, read_file, write_file


def make_sandbox(deployment: DeploymentConfig, env_variables: dict[str, str], name: str = "") -> Sandbox:
    """The sandbox for a deployment config; backends are imported lazily so optional SDKs stay optional."""
    if deployment.type == "local":
        from .local import LocalSandbox

        return LocalSandbox(deployment, env_variables, name=name)
    if deployment.type in ("docker", "podman"):
        from .container import ContainerSandbox

        return ContainerSandbox(deployment, env_variables, name=name)
    if deployment.type == "modal":
        from .modal import ModalSandbox

        return ModalSandbox(deployment, env_variables, name=name)
    if deployment.type == "memory":  # the data plane's stand-in for `uni-agent bench --simulate`
        from .memory import MemorySandbox

        return MemorySandbox(deployment, env_variables, name=name)
    raise ValueError(f"unknown deployment type {deployment.type!r}")


__all__ = ["ExecResult", "Sandbox", "SandboxError", "SandboxStartError", "clip_output", "make_sandbox",
           "read_file", "write_file"]
