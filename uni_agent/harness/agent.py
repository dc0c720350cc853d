"""The harness agent: a program that brings its own agent loop (mini-swe-agent, SWE-agent, a CLI, a user's script) runs
as the agent of a rollout, inside the rollout's sandbox, with the sandbox's network off. Reads top to bottom.

open the sandbox (retried, with the harness's read-only mounts) → post-setup → a lease at the worker's gateway (a
token of its own, the rollout's budgets) → the relay: the supervisor listens on 127.0.0.1 inside and carries each
connection to the gateway → the prompt as a file and a variable → the program runs (`harness.command`) until it exits,
its wall clock ends, or the gateway ends the episode (a budget: it gets `end_grace_s` to exit, then it is killed) →
patch = git diff → graded in the sandbox where the reward says so → sandbox closed → the row: the calls as the program
sent them (messages), their tokens and chains (calls.py), the program's exit code and output tail (`harness`).

How it ended (exit_reason): the program exited 0 → submitted; non-zero → program_failed (126/127, a command that
cannot run at all, count as the harness's infrastructure failure); killed at its wall clock → wall_clock; a budget →
max_turns / context_limit / wall_clock; the model endpoint or the sandbox failed → error (infra). Same constructor
and RolloutResult as UniAgentLoop, so the agent worker runs it as it runs our loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shlex
import time
from pathlib import Path
from typing import Any

import structlog

from ..config import AgentConfig, HarnessConfig
from ..episode.agent_loop import ChatModel, EpisodeEnd, SandboxGrader, SandboxOpener, collect_patch_and_close
from ..episode.exit_reason import ExitReason
from ..episode.failures import classify, infra
from ..episode.rollout import RolloutResult, RolloutSpec
from ..events import Emit, no_emit, rollout_event
from ..redact import redact
from ..sandbox import ExecResult, Sandbox, SandboxError
from ..sandbox.start import start_sandbox
from .gateway import Gateway, Lease, worker_gateway

log = structlog.get_logger("uni_agent.harness")

PROMPT_ENV_LIMIT = 100_000  # characters; a longer prompt is only in the file (one variable may hold 128 KiB)
CANNOT_RUN = (126, 127)  # the shell's codes for a command that is not executable / not found


class HarnessAgent:
    """One rollout of a program that brings its own loop (a fresh instance per rollout, as UniAgentLoop)."""

    def __init__(self, agent: AgentConfig, model: ChatModel, emit: Emit = no_emit, *,
                 open_sandbox: SandboxOpener = start_sandbox, grade_in_sandbox: SandboxGrader | None = None,
                 gateway: Gateway | None = None):
        if agent.harness is None:
            raise ValueError(f"agent {agent.name!r}: {__name__}.HarnessAgent needs a `harness:` block")
        self.agent, self.harness = agent, agent.harness
        self.model, self.emit = model, emit
        self.open_sandbox, self.grade_in_sandbox = open_sandbox, grade_in_sandbox
        self.gateway = gateway

    async def run(self, spec: RolloutSpec, worker: str = "") -> RolloutResult:
        agent = self.agent
        if spec.grade_in_agent_sandbox and self.grade_in_sandbox is None:
            raise ValueError(f"{spec.instance_id}: the reward is graded in the agent's sandbox, "
                             "but the harness agent was given no grade_in_sandbox")
        result = RolloutResult.begin(spec, agent.name, worker)
        bound = log.bind(run_id=spec.run_id, instance_id=spec.instance_id, rollout=spec.rollout)
        started = time.monotonic()
        limits = [self.harness.timeout, agent.interaction.episode_timeout, agent.env.deployment.deployment_timeout]
        deadline = started + min(x for x in limits if x)
        gateway = self.gateway or await worker_gateway()
        lease = Lease(self.model, _model_name(self.model), max_calls=self.harness.max_calls or
                      agent.interaction.max_turns, deadline=deadline, tools_in=agent.interaction.tools_in,
                      tool_parser=agent.interaction.tool_call_parser,
                      constrain_tool_calls=agent.interaction.constrain_tool_calls,
                      name=f"{spec.instance_id}-r{spec.rollout}")
        lease.on_call = lambda n: self._state(spec, worker, "running", turn=n, max_turns=lease.max_calls)
        sandbox: Sandbox | None = None
        try:
            self._state(spec, worker, "starting_sandbox")
            t0 = time.monotonic()
            sandbox = await self.open_sandbox(with_mounts(agent), f"{spec.instance_id}-r{spec.rollout}")
            result.sandbox_start_s = time.monotonic() - t0
            if agent.env.post_setup_cmd:
                setup = await sandbox.exec(agent.env.post_setup_cmd, agent.env.deployment.runtime_timeout)
                if setup.exit_code != 0:
                    raise SandboxError(f"post_setup_cmd failed (exit {setup.exit_code}): {setup.output[-1000:]}")
            gateway.register(lease)
            self._state(spec, worker, "running", turn=0, max_turns=lease.max_calls)
            outcome, interrupted = await self._run_program(sandbox, spec, lease, deadline, gateway)
            result.tools_s = outcome.duration_s
            self._settle(result, lease, outcome, interrupted)
            bound.info("harness_exited", exit_code=outcome.exit_code, timed_out=outcome.timed_out,
                       calls=lease.calls.calls)
        except EpisodeEnd as end:
            result.end(end.exit_reason, str(end))
        except (SandboxError, OSError) as exc:
            result.end(ExitReason.ERROR, f"{type(exc).__name__}: {exc}")
            infra(result, "sandbox", result.error)
        finally:
            gateway.unregister(lease)
            await gateway.close_door(lease)
            if sandbox is not None:
                await collect_patch_and_close(sandbox, result, self.agent,
                                              self.grade_in_sandbox if spec.grade_in_agent_sandbox else None,
                                              lambda: self._state(spec, result.worker, "verifying"))
        lease.calls.fill(result)
        result.messages = redact(result.messages)
        if result.error is not None:
            result.error = redact(result.error)
        classify(result)
        if result.failure_cause is not None:
            result.failure_cause = redact(result.failure_cause)
        if agent.mask_abnormal_exit_traj and result.exit_reason != ExitReason.SUBMITTED:
            result.masked, result.mask_reason = True, f"mask_abnormal_exit_traj: exit_reason {result.exit_reason}"
            result.loss_mask = [0] * len(result.loss_mask)
        result.total_s = time.monotonic() - started
        result.finished_at = time.time()
        bound.info("rollout_finished", exit_reason=result.exit_reason, turns=result.num_turns, error=result.error)
        return result

    async def _run_program(self, sandbox: Sandbox, spec: RolloutSpec, lease: Lease, deadline: float,
                           gateway: Gateway) -> tuple[ExecResult, bool]:
        """Run the program until it exits, its wall clock ends, or the gateway ends the episode (then it gets
        end_grace_s to exit by itself). Returns its result and whether it was stopped by us."""
        session = getattr(sandbox, "session", None)
        if session is None:
            raise SandboxError(f"the {self.agent.env.deployment.type} sandbox has no supervisor session: "
                               "a harness needs a local, container or Modal sandbox")
        port = await session.listen(await gateway.door(lease))
        script = await self._write_inputs(session, sandbox, spec, lease, port)
        left = max(deadline - time.monotonic(), 0.001)
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

    async def _write_inputs(self, session: Any, sandbox: Sandbox, spec: RolloutSpec, lease: Lease, port: int) -> str:
        """The prompt (a file, and a variable when it fits) and the script that runs the program; its path."""
        directory = f"{getattr(sandbox, 'state_dir', '/run/uni-agent')}/harness"
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

    def _settle(self, result: RolloutResult, lease: Lease, outcome: ExecResult, interrupted: bool) -> None:
        """The row's exit reason, error and `harness` column from how the program and the gateway ended."""
        tail = outcome.output[-self.harness.output_tail_chars:] if self.harness.output_tail_chars else ""
        result.harness = json.dumps({"exit_code": outcome.exit_code, "timed_out": outcome.timed_out and not interrupted,
                                     "stopped": interrupted, "seconds": round(outcome.duration_s, 3),
                                     "calls": lease.calls.calls, "refused_calls": lease.refused,
                                     "output_tail": redact(tail)}, ensure_ascii=False)
        if lease.end is not None:
            result.end(lease.end, lease.end_message if lease.end != ExitReason.SUBMITTED else None)
            if lease.infra is not None:
                infra(result, lease.infra, lease.end_message)
        elif outcome.timed_out:
            result.end(ExitReason.WALL_CLOCK, f"the program ran past its wall-clock budget "
                                              f"({outcome.duration_s:.0f} s)")
        elif outcome.exit_code == 0:
            result.end(ExitReason.SUBMITTED)
        elif outcome.exit_code in CANNOT_RUN:
            result.end(ExitReason.ERROR, f"the harness command could not run (exit {outcome.exit_code}): "
                                         f"{outcome.output.strip()[-500:]}")
            infra(result, "harness", result.error)
        else:
            result.end(ExitReason.PROGRAM_FAILED, f"the program exited with code {outcome.exit_code}")

    def _state(self, spec: RolloutSpec, worker: str, state: str, **fields: Any) -> None:
        self.emit(rollout_event(spec.run_id, spec.instance_id, spec.rollout, state, worker=worker, **fields))


def with_mounts(agent: AgentConfig) -> AgentConfig:
    """The agent with its harness's mounts added to the deployment's (the backends bind them read-only)."""
    harness: HarnessConfig | None = agent.harness
    if harness is None or not harness.mounts:
        return agent
    deployment = agent.env.deployment
    if not hasattr(deployment, "mounts"):
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


def _model_name(model: Any) -> str:
    """The run's model name, for /v1/models (a RolloutSession's replicas all serve the same model)."""
    router = getattr(model, "router", None)
    if router is not None and router.clients:
        return next(iter(router.clients.values())).model
    return str(getattr(model, "model", "uni-agent"))
