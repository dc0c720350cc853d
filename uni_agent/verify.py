"""Moved to uni_agent.grading (issue 17); this module goes once its last callers import from there.

Until then it keeps its old blocking entry points for the callers that submit them to Dask as plain functions.
"""

from __future__ import annotations

import asyncio

from .config import AgentConfig
from .grading import ReferenceKind, Verification, check_reward_config, grade_in_sandbox
from .grading import verify_patch as verify_patch_async
from .grading import verify_reference as verify_reference_async

__all__ = ["ReferenceKind", "Verification", "check_reward_config", "grade_in_sandbox", "verify_patch",
           "verify_patch_async", "verify_reference"]


def verify_patch(agent: AgentConfig, patch: str, name: str = "verify") -> Verification:
    return asyncio.run(verify_patch_async(agent, patch, name))


def verify_reference(agent: AgentConfig, kind: ReferenceKind, name: str = "verify") -> Verification:
    return asyncio.run(verify_reference_async(agent, kind, name))
