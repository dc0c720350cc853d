"""Opening a rollout's sandbox (with retries) and reading what the agent changed in it.

Both are used by the agent loop and by grading; they live here so that grading does not import the agent loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential_jitter
from tenacity.wait import wait_base

from .base import DeploymentBase, Sandbox, SandboxError, SandboxStartError

START_RETRY_WAIT = wait_exponential_jitter(multiplier=0.5, max=10)


class SandboxEnv(Protocol):
    """What a sandbox is made from: an agent config's `env` (uni_agent.config.EnvConfig)."""

    @property
    def deployment(self) -> DeploymentBase: ...

    @property
    def env_variables(self) -> dict[str, str]: ...


class HasSandboxEnv(Protocol):
    """What start_sandbox reads of an agent config (uni_agent.config.AgentConfig): its `env`."""

    @property
    def env(self) -> SandboxEnv: ...


def build(deployment: DeploymentBase, env_variables: dict[str, str], name: str = "") -> Sandbox:
    return deployment.build(env_variables, name=name)


async def start_sandbox(agent: HasSandboxEnv, name: str, *, make: Callable[..., Sandbox] = build,
                        wait: wait_base = START_RETRY_WAIT) -> Sandbox:
    """Start a sandbox, retrying transient start failures; a half-started sandbox is always closed. `make` builds
    the sandbox from (deployment, env_variables, name=...) (by default the deployment's own `build`) and `wait`
    spaces the retries (tests pass their own)."""
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
