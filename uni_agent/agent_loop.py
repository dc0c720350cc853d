"""The agent loop: one rollout from sandbox start to patch. Reads top to bottom.

start sandbox (retried) → post-setup → turns: ask the model → parse tool calls → run them → observations …
until `submit`, max_turns, the context limit, the timeout budget, or an error → patch = git diff → close sandbox.
Verification runs afterwards as a Dask future in a fresh sandbox, or, for a reward graded in the agent's own sandbox
(reward.in_agent_sandbox: Terminal-Bench), here before the sandbox closes.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import structlog

from .config import AgentConfig
from .events import Emit, no_emit, rollout_event
from .failures import classify, infra
from .llm import ChatClient, ChatReply, ContextLimitError, LLMError
from .redact import redact
from .rollout import RolloutResult, RolloutSpec
from .sandbox import Sandbox, SandboxError
from .sandbox.start import start_sandbox, workspace_patch
from .tool_calls import (
    ToolCall,
    ToolCallFormatError,
    parse_structured,
    parse_text,
    tool_call_json_schema,
    tool_format_instructions,
)
from .tools.toolbox import Toolbox
from .trajectory import TurnTokens, build_sequence

log = structlog.get_logger("uni_agent.agent")

NO_TOOL_CALL_HINT = (
    "Your reply contained no tool call. Every reply must call exactly one of the tools "
    "(use `submit` when you are done)."
)


class EpisodeEnd(Exception):
    """Ends the episode; the subclass name is not used, `exit_reason` is."""

    def __init__(self, exit_reason: str, message: str = ""):
        super().__init__(message or exit_reason)
        self.exit_reason = exit_reason


class UniAgentLoop:
    def __init__(self, agent: AgentConfig, llm: ChatClient, emit: Emit = no_emit):
        self.agent = agent
        self.llm = llm
        self.emit = emit
        self._tokens: list[TurnTokens] = []  # each model call's tokens, as the engine reported them
        self._tokens_missing: str | None = None  # the first call that came back without them, and why
        self._token_source = ""
        self._context = None  # llama_server token-in: the ids the next call continues (llm.TokenContext)

    async def run(self, spec: RolloutSpec, worker: str = "") -> RolloutResult:
        agent = self.agent
        result = RolloutResult(
            run_id=spec.run_id, instance_id=spec.instance_id, rollout=spec.rollout, data_source=spec.data_source,
            agent_name=agent.name, exit_reason="error", worker=worker, started_at=time.time(),
        )
        bound = log.bind(run_id=spec.run_id, instance_id=spec.instance_id, rollout=spec.rollout)
        messages = self._initial_messages(spec.prompt)
        sandbox: Sandbox | None = None
        started = time.monotonic()
        self._state = lambda state, **fields: self.emit(
            rollout_event(spec.run_id, spec.instance_id, spec.rollout, state, worker=worker, **fields))
        try:
            self._state("starting_sandbox")
            t0 = time.monotonic()
            sandbox = await start_sandbox(agent, name=f"{spec.instance_id}-r{spec.rollout}")
            result.sandbox_start_s = time.monotonic() - t0
            bound.info("sandbox_started", seconds=round(result.sandbox_start_s, 3))
            if agent.env.post_setup_cmd:
                setup = await sandbox.exec(agent.env.post_setup_cmd, agent.env.deployment.runtime_timeout)
                if setup.exit_code != 0:
                    raise SandboxError(f"post_setup_cmd failed (exit {setup.exit_code}): {setup.output[-1000:]}")
            toolbox = Toolbox([t.name for t in agent.tools], sandbox, agent.interaction)
            budget = self._wall_budget()
            try:
                async with asyncio.timeout(budget - (time.monotonic() - started) if budget else None):
                    result.exit_reason = await self._interact(messages, toolbox, result, bound)
            except TimeoutError:
                message = f"the episode ran past its wall-clock budget of {budget:g} s"
                raise EpisodeEnd("timeout_budget", message) from None
        except EpisodeEnd as end:
            result.exit_reason, result.error = end.exit_reason, str(end)
        except ContextLimitError as exc:
            result.exit_reason, result.error = "context_limit", str(exc)
        except LLMError as exc:  # transport errors and 429/5xx after retries, or an unusable answer
            result.exit_reason, result.error = "error", f"{type(exc).__name__}: {exc}"
            infra(result, "llm", result.error)
        except (SandboxError, OSError) as exc:
            result.exit_reason, result.error = "error", f"{type(exc).__name__}: {exc}"
            infra(result, "sandbox", result.error)
        finally:
            if sandbox is not None:
                await self._collect_patch_and_close(sandbox, result, spec.grade_in_sandbox)
        result.messages = redact(json.dumps(messages, ensure_ascii=False))
        if result.error is not None:  # an endpoint's error body may echo the request's credentials
            result.error = redact(result.error)
        classify(result)  # settled again once the driver's verification is recorded (runner)
        if result.failure_cause is not None:
            result.failure_cause = redact(result.failure_cause)
        self._record_tokens(result)
        result.total_s = time.monotonic() - started
        result.finished_at = time.time()
        bound.info("rollout_finished", exit_reason=result.exit_reason, turns=result.num_turns, error=result.error)
        return result

    async def _collect_patch_and_close(self, sandbox: Sandbox, result: RolloutResult, grade: bool) -> None:
        # Whatever ended the episode, the work done so far is kept: a max_turns or timeout rollout is still graded.
        try:
            result.patch = await workspace_patch(sandbox)
        except (SandboxError, OSError) as exc:
            if result.error is None:
                result.exit_reason, result.error = "error", f"could not collect the patch: {exc}"
                infra(result, "sandbox", result.error)
        try:
            if grade:  # reward.in_agent_sandbox: the tests see the machine as the agent left it
                from .verify import grade_in_sandbox  # verify imports this module

                self._state("verifying")
                result.record(await grade_in_sandbox(sandbox, self.agent))
        finally:
            await sandbox.close()

    def _initial_messages(self, prompt: list[dict[str, Any]]) -> list[dict[str, Any]]:
        messages = [dict(m) for m in prompt]
        if self.agent.system_prompt is not None:
            messages = [m for m in messages if m.get("role") != "system"]
            messages.insert(0, {"role": "system", "content": self.agent.system_prompt})
        return messages

    def _wall_budget(self) -> float | None:
        """Seconds the episode may take: the episode timeout, and never past the sandbox's lifetime."""
        limits = [self.agent.interaction.episode_timeout, self.agent.env.deployment.deployment_timeout]
        return min((x for x in limits if x), default=None)

    async def _interact(self, messages, toolbox: Toolbox, result: RolloutResult, bound) -> str:
        interaction = self.agent.interaction
        schemas = toolbox.schemas
        if interaction.tools_in == "prompt":
            instructions = tool_format_instructions(schemas, interaction.tool_parser)
            if messages and messages[0].get("role") == "system":
                messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{instructions}"}
            else:
                messages.insert(0, {"role": "system", "content": instructions})
        api_tools = schemas if interaction.tools_in == "api" else None
        response_format = None
        if interaction.constrain_tool_calls:
            response_format = {"type": "json_object", "schema": tool_call_json_schema(schemas)}
        timeouts_left = interaction.timeout_budget
        for turn in range(1, interaction.max_turns + 1):
            result.num_turns = turn
            self._state("running", turn=turn, max_turns=interaction.max_turns)
            reply = await self.llm.chat(messages, api_tools, response_format, context=self._context)
            self._context = reply.context
            result.llm_s += reply.latency_s
            result.prompt_tokens += reply.prompt_tokens
            result.completion_tokens += reply.completion_tokens
            self._keep_tokens(reply, turn)
            # The conversation keeps what the model sampled, verbatim where the engine gives it (a server's chat parser
            # may trim it): the next prompt then continues the tokens of this one (uni_agent.trajectory).
            said = reply.raw_text if reply.raw_text is not None and not reply.tool_calls else reply.content
            assistant: dict[str, Any] = {"role": "assistant", "content": said}
            if reply.tool_calls:
                assistant["tool_calls"] = reply.tool_calls
            messages.append(assistant)
            calls, structured = self._parse(reply, schemas, messages)
            if calls is None:
                continue
            for call in calls:
                outcome = await toolbox.run(call)
                result.tools_s += outcome.duration_s
                self._observe(messages, call, outcome.observation, structured)
                bound.debug("tool_call", turn=turn, tool=call.name, status=outcome.status)
                if outcome.submitted:
                    return "submitted"
                if outcome.status == "timeout":
                    timeouts_left -= 1
                    if timeouts_left < 0:
                        raise EpisodeEnd("timeout_budget", f"more than {interaction.timeout_budget} command timeouts")
        return "max_turns"

    def _keep_tokens(self, reply: ChatReply, turn: int) -> None:
        self._token_source = reply.token_source
        if reply.tokens is not None:
            self._tokens.append(reply.tokens)
        elif reply.token_source and self._tokens_missing is None:
            self._tokens_missing = f"turn {turn}: {reply.tokens_missing}"

    def _record_tokens(self, result: RolloutResult) -> None:
        """The rollout's training sequence (uni_agent.trajectory) and its mask. A rollout some of whose calls came
        back without tokens gets none: a sequence with a hole would not be what the model saw."""
        result.token_source = self._token_source
        if self._tokens_missing is not None:
            result.tokens_missing = self._tokens_missing
        elif self._tokens:
            seq = build_sequence(self._tokens)
            result.input_ids, result.loss_mask, result.logprobs = seq.input_ids, seq.loss_mask, seq.logprobs
            result.token_drift = seq.drift_json()
        if self.agent.mask_abnormal_exit_traj and result.exit_reason != "submitted":
            # the seed's meaning: a rollout that did not end with `submit` is not trained on
            result.masked, result.mask_reason = True, f"mask_abnormal_exit_traj: exit_reason {result.exit_reason}"
            result.loss_mask = [0] * len(result.loss_mask)

    def _parse(self, reply, schemas, messages) -> tuple[list[ToolCall] | None, bool]:
        """The reply's tool calls, or None after appending an error observation the model can act on."""
        try:
            if reply.tool_calls:
                return parse_structured(reply.tool_calls, schemas), True
            parsed = parse_text(reply.content, schemas, self.agent.interaction.tool_parser)
        except ToolCallFormatError as exc:
            self._error_observation(messages, reply, f"Error in your tool call: {exc}")
            return None, bool(reply.tool_calls)
        if not parsed.calls:
            messages.append({"role": "user", "content": NO_TOOL_CALL_HINT})
            return None, False
        return parsed.calls, False

    @staticmethod
    def _error_observation(messages, reply, text: str) -> None:
        # Structured calls need one tool message per call id to keep the conversation well-formed.
        ids = [c.get("id") for c in reply.tool_calls if isinstance(c, dict) and c.get("id")]
        if ids:
            messages.extend({"role": "tool", "tool_call_id": i, "content": text} for i in ids)
        else:
            messages.append({"role": "user", "content": text})

    @staticmethod
    def _observe(messages, call: ToolCall, observation: str, structured: bool) -> None:
        if structured:
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": observation})
        else:
            messages.append({"role": "user", "content": f"Observation from `{call.name}`:\n{observation}"})
