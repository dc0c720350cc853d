"""Sandboxes: one protocol and the config every backend's has (base.py), and one module per backend, its config
class beside it (local.py, container.py, modal.py, memory.py). A deployment's `type` picks the config class
(deployment_types.py's DEPLOYMENTS, imported by name), whose `build()` makes the sandbox: no backend is imported
before a deployment of its type is validated, and none needs an optional SDK (modal) before a sandbox starts."""

from __future__ import annotations

from .base import (DeploymentBase, ExecResult, Sandbox, SandboxError, SandboxStartError, clip_output, read_file,
                   write_file)

__all__ = ["DeploymentBase", "ExecResult", "Sandbox", "SandboxError", "SandboxStartError", "clip_output", "read_file",
           "write_file"]
