"""Opening a rollout's sandbox (with retries) and reading what the agent changed in it.

Both are used by the agent loop and by grading; they live here so that grading does not import the agent loop.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter
from tenacity.wait import wait_base

from ..config import AgentConfig
from . import make_sandbox
from .base import Sandbox, SandboxError, SandboxStartError

START_RETRY_WAIT = wait_exponential_jitter(multiplier=0.5, max=10)


async def start_sandbox(agent: AgentConfig, name: str, *, make: Callable[..., Sandbox] = make_sandbox,
                        wait: wait_base = START_RETRY_WAIT) -> Sandbox:
    """Start a sandbox, retrying transient start failures; a half-started sandbox is always closed. `make` builds
    the sandbox from (deployment, env_variables, name=...) and `wait` spaces the retries (tests pass their own)."""
    deployment = agent.env.deployment
    retrying = AsyncRetrying(
        retry=retry_if_exception_type((SandboxStartError, OSError)),
        stop=stop_after_attempt(deployment.start_retries),
        wait=wait,
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            sandbox = make(deployment, agent.env.env_variables, name=name)
            try:
                await sandbox.start()
            except BaseException:
                await sandbox.close()
                raise
            return sandbox
    raise AssertionError("unreachable")


PATCH_COMMAND = "git add -A && git diff --cached --binary HEAD"  # run at the workdir; stand-in sandboxes match it


async def workspace_patch(sandbox: Sandbox, timeout: float = 120) -> str:
    """Everything the agent changed in the workspace, as a git diff against the base snapshot."""
    result = await sandbox.exec(f"cd {sandbox.workdir} && {PATCH_COMMAND}", timeout, merge_stderr=False)
    if result.exit_code != 0:
        raise SandboxError(f"git diff failed: {result.stderr.decode('utf-8', 'replace')[-500:]}")
    return result.stdout.decode("utf-8", errors="replace")
