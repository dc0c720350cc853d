"""The sandbox backends, by deployment `type`: each name is its config class's "module:Class" path, imported when a
deployment of that type is validated (so a Modal config loads modal.py, never the local backend; no backend needs
its SDK until a sandbox starts). The config class sits beside its backend and makes it (DeploymentBase.build).

A backend from outside the package is named by its config class's import path in `type` (it reaches every worker
that can import it), or registered here (`DEPLOYMENTS.register("k8s", K8sConfig)`, in the process that validates).
"""

from __future__ import annotations

from typing import Any

from ..registry import Registry
from .base import DeploymentBase

DEPLOYMENTS: Registry[type[DeploymentBase]] = Registry("deployment type", {
    "local": "uni_agent.sandbox.local:LocalDeploymentConfig",
    "docker": "uni_agent.sandbox.container:ContainerDeploymentConfig",
    "podman": "uni_agent.sandbox.container:ContainerDeploymentConfig",
    "modal": "uni_agent.sandbox.modal:ModalDeploymentConfig",
    "memory": "uni_agent.sandbox.memory:MemoryDeploymentConfig",
})


def deployment_config(value: dict[str, Any]) -> DeploymentBase:
    """A deployment mapping validated by the config class its `type` names (`local` when it names none)."""
    config_class = DEPLOYMENTS.get(value.get("type", "local"))
    if not (isinstance(config_class, type) and issubclass(config_class, DeploymentBase)):
        raise ValueError(f"type {value['type']!r} names {config_class!r}, not a subclass of "
                         "uni_agent.sandbox.base.DeploymentBase")
    return config_class.model_validate(value)
