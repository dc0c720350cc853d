"""The harness agent: a program that brings its own agent loop (mini-swe-agent, SWE-agent, a CLI, a user's script) runs
as the agent of a rollout, inside the rollout's sandbox, with the sandbox's network off. An agent strategy
(uni_agent.episode.strategy): the envelope starts the sandbox (with the harness's read-only mounts), runs
post-setup, takes the patch, grades, closes and classifies; this only acts. Reads top to bottom.

a lease at the worker's gateway (a token of its own, the rollout's budgets) → the relay: the supervisor listens on
127.0.0.1 inside and carries each connection to the gateway → the prompt as a file and a variable → the program runs
(`harness.command`) until it exits, its wall clock ends, or the gateway ends the episode (a budget: it gets
`end_grace_s` to exit, then it is killed) → the row: the calls as the program sent them (messages), their tokens and
chains (calls.py), the program's exit code and output tail (`harness`).

How it ended (exit_reason): the program exited 0 → submitted; non-zero → program_failed (126/127, a command that
cannot run at all, count as the harness's infrastructure failure); killed at its wall clock → wall_clock; a budget →
max_turns / context_limit / wall_clock; the model endpoint or the sandbox failed → error (infra).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import structlog

from ..config import AgentConfig, HarnessConfig
from ..episode.ending import Ending, infra_failure
from ..episode.exit_reason import ExitReason
from ..episode.failures import FailedPart
from ..episode.rollout import RolloutResult, RolloutSpec
from ..episode.strategy import Episode
from ..events import RolloutState
from ..redact import redact
from ..sandbox import ExecResult, Sandbox, SandboxError
from ..sandbox.session import HOST_GRACE_S, Session
from .gateway import Gateway, Lease, worker_gateway

log = structlog.get_logger("uni_agent.harness")

PROMPT_ENV_LIMIT = 100_000  # characters; a longer prompt is only in the file (one variable may hold 128 KiB)
CANNOT_RUN = (126, 127)  # the shell's codes for a command that is not executable / not found


@runtime_checkable
class SupervisedSandbox(Sandbox, Protocol):
    """A sandbox whose supervisor session a harness talks to (local, containers, Modal: sandbox.backend's
    SessionSandbox): it relays the program's connections and runs it as a command that can be interrupted."""

    session: Session | None
    state_dir: str


class HarnessAgent:
    """One rollout of a program that brings its own loop (a fresh one per rollout: it keeps the rollout's lease)."""

    def __init__(self, agent: AgentConfig, gateway: Gateway | None = None):
        if agent.harness is None:
            raise ValueError(f"agent {agent.name!r}: {__name__}.HarnessAgent needs a `harness:` block")
        self.agent, self.harness = agent, agent.harness
        self.gateway = gateway  # None: the agent worker's own (worker_gateway)
        self.lease: Lease | None = None
        # The program is killed at the deadline by its own command timeout and says how it ended: the envelope waits
        # that long past the deadline before it stops the episode itself
        self.grace_s = self.harness.end_grace_s + HOST_GRACE_S

    def sandbox_config(self) -> AgentConfig:
        return with_mounts(self.agent)

    def time_limit(self) -> float | None:
        return self.harness.timeout

    async def act(self, episode: Episode) -> Ending:
        agent, spec = self.agent, episode.spec
        gateway = self.gateway or await worker_gateway()
        interaction = agent.interaction
        lease = self.lease = Lease(
            episode.model, episode.model.model, max_calls=self.harness.max_calls or interaction.max_turns,
            deadline=episode.budget.deadline, tools_in=interaction.tools_in,
            tool_parser=interaction.tool_call_parser, constrain_tool_calls=interaction.constrain_tool_calls,
            name=f"{spec.instance_id}-r{spec.rollout}")
        lease.on_call = lambda n: episode.state(RolloutState.RUNNING, turn=n, max_turns=lease.max_calls)
        try:
            sandbox = await episode.sandbox.ready()
            if not isinstance(sandbox, SupervisedSandbox) or sandbox.session is None:
                raise SandboxError(f"the {agent.env.deployment.type} sandbox has no supervisor session: a harness "
                                   "needs a local, container or Modal sandbox")
            gateway.register(lease)
            episode.state(RolloutState.RUNNING, turn=0, max_turns=lease.max_calls)
            outcome, interrupted = await self._run_program(sandbox, sandbox.session, spec, lease, gateway)
            episode.row.tools_s = outcome.duration_s
            episode.row.harness = self._program_record(lease, outcome, interrupted)
            episode.log.info("harness_exited", exit_code=outcome.exit_code, timed_out=outcome.timed_out,
                             calls=lease.calls.calls)
            return self._ending(lease, outcome)
        finally:
            gateway.unregister(lease)
            await gateway.close_door(lease)

    def record(self, row: RolloutResult) -> None:
        """The calls as the program sent them, their chains and token columns (calls.py)."""
        if self.lease is not None:
            self.lease.calls.fill(row)

    async def _run_program(self, sandbox: SupervisedSandbox, session: Session, spec: RolloutSpec, lease: Lease,
                           gateway: Gateway) -> tuple[ExecResult, bool]:
        """Run the program until it exits, its wall clock ends, or the gateway ends the episode (then it gets
        end_grace_s to exit by itself). Returns its result and whether it was stopped by us."""
        port = await session.listen(await gateway.door(lease))
        script = await self._write_inputs(session, sandbox, spec, lease, port)
        left = max((lease.deadline or 0) - time.monotonic(), 0.001)
        program = asyncio.ensure_future(session.run(f"bash --noprofile --norc {shlex.quote(script)}", left, None,
                                                    True))
        ended = asyncio.ensure_future(lease.ended.wait())
        interrupted = False
        try:
            await asyncio.wait({program, ended}, return_when=asyncio.FIRST_COMPLETED)
            if not program.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(program), self.harness.end_grace_s)
            if not program.done():
                interrupted = True
                await session.interrupt()
            return await program, interrupted
        finally:
            ended.cancel()
            if not program.done():  # we are being cancelled: the session kills the command on the way out
                program.cancel()
                with contextlib.suppress(BaseException):
                    await program

    async def _write_inputs(self, session: Session, sandbox: SupervisedSandbox, spec: RolloutSpec, lease: Lease,
                            port: int) -> str:
        """The prompt (a file, and a variable when it fits) and the script that runs the program; its path."""
        directory = f"{sandbox.state_dir}/harness"
        prompt = prompt_text(spec.prompt)
        await session.write_file(f"{directory}/prompt.md", prompt.encode())
        await session.write_file(f"{directory}/messages.json", json.dumps(spec.prompt, ensure_ascii=False).encode())
        base_url = f"http://127.0.0.1:{port}/v1"
        env = {**self.harness.env, "OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url,
               "OPENAI_API_KEY": lease.token, "UNI_AGENT_MODEL": lease.model_name,
               "UNI_AGENT_PROMPT_FILE": f"{directory}/prompt.md", "UNI_AGENT_MESSAGES_FILE": f"{directory}/messages.json",
               "UNI_AGENT_WORKDIR": sandbox.workdir, "UNI_AGENT_MAX_CALLS": str(lease.max_calls)}
        if len(prompt) <= PROMPT_ENV_LIMIT:
            env["UNI_AGENT_PROMPT"] = prompt
        lines = [f"export {key}={shlex.quote(value)}" for key, value in env.items()]
        lines += [f"cd -- {shlex.quote(sandbox.workdir)} || exit 126", self.harness.command, ""]
        await session.write_file(f"{directory}/run.sh", "\n".join(lines).encode())
        return f"{directory}/run.sh"

    def _program_record(self, lease: Lease, outcome: ExecResult, interrupted: bool) -> dict[str, Any]:
        """The row's `harness` column: how the program ran and ended, and the end of its output."""
        tail = outcome.output[-self.harness.output_tail_chars:] if self.harness.output_tail_chars else ""
        return {"exit_code": outcome.exit_code, "timed_out": outcome.timed_out and not interrupted,
                "stopped": interrupted, "seconds": round(outcome.duration_s, 3), "calls": lease.calls.calls,
                "refused_calls": lease.refused, "output_tail": redact(tail)}

    def _ending(self, lease: Lease, outcome: ExecResult) -> Ending:
        """How the episode ended: the gateway's ending first (a budget, the model endpoint), else the program's."""
        if lease.ending is not None:
            return lease.ending
        if outcome.timed_out:
            return Ending(ExitReason.WALL_CLOCK,
                          f"the program ran past its wall-clock budget ({outcome.duration_s:.0f} s)")
        if outcome.exit_code == 0:
            return Ending(ExitReason.SUBMITTED)
        if outcome.exit_code in CANNOT_RUN:
            return infra_failure(FailedPart.HARNESS, f"the harness command could not run (exit {outcome.exit_code}): "
                                                     f"{outcome.output.strip()[-500:]}")
        return Ending(ExitReason.PROGRAM_FAILED, f"the program exited with code {outcome.exit_code}")


def with_mounts(agent: AgentConfig) -> AgentConfig:
    """The agent with its harness's mounts added to the deployment's (the backends bind them read-only)."""
    harness: HarnessConfig | None = agent.harness
    if harness is None or not harness.mounts:
        return agent
    deployment = agent.env.deployment
    if "mounts" not in type(deployment).model_fields:
        raise SandboxError(f"harness.mounts need a local, podman or docker sandbox; a {deployment.type} sandbox "
                           "cannot mount host directories (put the program into its image instead)")
    mounts = {**deployment.mounts}
    for inside, host in harness.mounts.items():
        path = Path(host).expanduser()
        if not path.is_dir():
            raise SandboxError(f"harness.mounts[{inside!r}]: {host} is not a directory on this host (prepare it with "
                               "`uni-agent harness prepare`, docs/harness.md)")
        mounts[inside] = str(path.resolve())
    env = agent.env.model_copy(update={"deployment": deployment.model_copy(update={"mounts": mounts})})
    return agent.model_copy(update={"env": env})


def prompt_text(prompt: list[dict[str, Any]]) -> str:
    """The task as text: the row's user messages (a program brings its own system prompt)."""
    parts = []
    for message in prompt:
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(str(content or ""))
    return "\n\n".join(parts)
