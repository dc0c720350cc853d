"""The agent loop: one rollout from sandbox start to patch. Reads top to bottom.

open the sandbox (retried) → post-setup → steps, each a query (ask the model) and an execution (parse its tool calls,
run them, add the observations) … until `submit`, max_turns, the context limit, too many command timeouts, the wall
clock, or an error (ExitReason) → patch = git diff → close the sandbox.

Everything the loop talks to is given to it: the model (anything with `chat`: ChatModel), the sandbox opener, the
event sink, and, for a reward graded in the agent's own sandbox (reward.in_agent_sandbox: Terminal-Bench), the grader
that runs before the sandbox closes. It imports no grading: other verification runs afterwards, in a fresh sandbox.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from ..config import AgentConfig
from .conversation import Conversation
from ..events import Emit, no_emit, rollout_event
from .exit_reason import ExitReason
from .failures import classify, infra
from ..llm import ChatReply, ContextLimitError, LLMError, TokenContext
from ..redact import redact
from ..registry import import_object
from .rollout import RolloutResult, RolloutSpec
from ..sandbox import Sandbox, SandboxError
from ..sandbox.start import start_sandbox, workspace_patch
from ..tool_calls import (
    ToolCall,
    ToolCallFormatError,
    decoding_schema,
    parse_structured,
    parse_text,
    tool_format_instructions,
)
from ..tools.toolbox import Toolbox, tool_schemas
from .trajectory import TokenLog

if TYPE_CHECKING:
    from ..grading.verification import Verification

log = structlog.get_logger("uni_agent.agent")

__all__ = ["ChatModel", "EpisodeEnd", "SandboxGrader", "SandboxOpener", "UniAgentLoop", "first_request",
           "request_tools", "start_sandbox", "workspace_patch"]


class ChatModel(Protocol):
    """What the loop asks of its model: a ChatClient, or the worker's RolloutSession (which moves a rollout to another
    engine replica when its own is down)."""

    async def chat(self, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                   response_format: dict[str, Any] | None = None, context: TokenContext | None = None
                   ) -> ChatReply: ...


SandboxOpener = Callable[[AgentConfig, str], Awaitable[Sandbox]]  # (agent, sandbox name) -> a started sandbox
SandboxGrader = Callable[[Sandbox, AgentConfig], Awaitable["Verification"]]  # grading in the agent's own sandbox

# Who closes an episode's sandbox once its patch (and in-sandbox grade) is taken. Unset, the episode awaits the close
# itself: the sandbox is gone when the result returns. An agent worker sets it for its rollouts and closes them in the
# background (awaited at its own close): ending a sandbox (its processes, its pid namespace, its dir) took 0.1-0.4 s
# at the median under load, time the result does not depend on.
sandbox_closer: ContextVar[Callable[[Sandbox], None] | None] = ContextVar("sandbox_closer", default=None)


async def collect_patch_and_close(sandbox: Sandbox, result: RolloutResult, agent: AgentConfig,
                                  grade: SandboxGrader | None, on_grading: Callable[[], None]) -> None:
    """The end of every episode, whatever ended it: the workspace's patch kept (a max_turns or timeout rollout is
    still graded), graded in this sandbox when `grade` is given (the tests see the machine as the agent left it), and
    the sandbox closed on every path (or handed to `sandbox_closer`, where one is set)."""
    try:
        result.patch = await workspace_patch(sandbox)
    except (SandboxError, OSError) as exc:
        if result.error is None:
            result.end(ExitReason.ERROR, f"could not collect the patch: {exc}")
            infra(result, "sandbox", result.error)
    try:
        if grade is not None:
            on_grading()
            result.record(await grade(sandbox, agent))
    finally:
        closer = sandbox_closer.get()
        if closer is None:
            await sandbox.close()
        else:
            closer(sandbox)


class EpisodeEnd(Exception):
    """Ends the episode; the subclass name is not used, `exit_reason` is."""

    def __init__(self, exit_reason: ExitReason, message: str = ""):
        super().__init__(message or exit_reason)
        self.exit_reason = exit_reason


class UniAgentLoop:
    """One rollout (a fresh loop per rollout: it keeps the rollout's token context and command-timeout count)."""

    def __init__(self, agent: AgentConfig, model: ChatModel, emit: Emit = no_emit, *,
                 open_sandbox: SandboxOpener = start_sandbox, grade_in_sandbox: SandboxGrader | None = None):
        self.agent = agent
        self.model = model
        self.emit = emit
        self.open_sandbox = open_sandbox
        self.grade_in_sandbox = grade_in_sandbox
        self._tokens = TokenLog()  # each model call's tokens, as the engine reported them
        self._context: TokenContext | None = None  # llama_server token-in: the ids the next call continues
        self._timeouts_left = 0  # command timeouts the episode may still take (interaction.timeout_budget)

    async def run(self, spec: RolloutSpec, worker: str = "") -> RolloutResult:
        agent = self.agent
        if spec.grade_in_agent_sandbox and self.grade_in_sandbox is None:
            raise ValueError(f"{spec.instance_id}: the reward is graded in the agent's sandbox, "
                             "but the agent loop was given no grade_in_sandbox")
        result = RolloutResult.begin(spec, agent.name, worker)
        bound = log.bind(run_id=spec.run_id, instance_id=spec.instance_id, rollout=spec.rollout)
        conversation = Conversation(spec.prompt, agent.system_prompt)
        started = time.monotonic()
        self._state = lambda state, **fields: self.emit(
            rollout_event(spec.run_id, spec.instance_id, spec.rollout, state, worker=worker, **fields))
        starting: asyncio.Task[Sandbox] | None = None
        try:
            self._state("starting_sandbox")
            # The first model call needs only the prompt: the sandbox starts meanwhile, and is awaited before the
            # first tool call (a wave's start burst then overlaps the first turn instead of adding to it).
            starting = asyncio.ensure_future(self._start(f"{spec.instance_id}-r{spec.rollout}", result, bound))
            result.end(await self._within_wall_clock(self._interact(conversation, starting, result, bound), started))
        except EpisodeEnd as end:
            result.end(end.exit_reason, str(end))
        except ContextLimitError as exc:
            result.end(ExitReason.CONTEXT_LIMIT, str(exc))
        except LLMError as exc:  # transport errors and 429/5xx after retries, or an unusable answer
            result.end(ExitReason.ERROR, f"{type(exc).__name__}: {exc}")
            infra(result, "llm", result.error)
        except (SandboxError, OSError) as exc:
            result.end(ExitReason.ERROR, f"{type(exc).__name__}: {exc}")
            infra(result, "sandbox", result.error)
        finally:
            sandbox = await _started_or_stopped(starting)
            if sandbox is not None:
                await collect_patch_and_close(sandbox, result, self.agent,
                                              self.grade_in_sandbox if spec.grade_in_agent_sandbox else None,
                                              lambda: self._state("verifying"))
        result.messages = redact(conversation.to_json())
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

    async def _start(self, name: str, result: RolloutResult, bound: Any) -> Sandbox:
        """The rollout's sandbox, started (with the opener's retries); sandbox_start_s is the start alone."""
        t0 = time.monotonic()
        sandbox = await self.open_sandbox(self.agent, name)
        result.sandbox_start_s = time.monotonic() - t0
        bound.info("sandbox_started", seconds=round(result.sandbox_start_s, 3))
        return sandbox

    async def _ready(self, starting: asyncio.Task[Sandbox]) -> Toolbox:
        """The started sandbox, set up (post_setup_cmd), with the tools bound to it."""
        sandbox = await starting
        env = self.agent.env
        if env.post_setup_cmd:
            setup = await sandbox.exec(env.post_setup_cmd, env.deployment.runtime_timeout)
            if setup.exit_code != 0:
                raise SandboxError(f"post_setup_cmd failed (exit {setup.exit_code}): {setup.output[-1000:]}")
        return Toolbox([t.name for t in self.agent.tools], sandbox, self.agent.interaction)

    async def _first_turn(self, query: Awaitable[ChatReply], starting: asyncio.Task[Sandbox],
                          result: RolloutResult) -> tuple[ChatReply, Toolbox]:
        """The first reply, asked while the sandbox starts, and the tools once it has started and been set up. A start
        that fails before the reply cancels the call: the episode ends with the start's error at once."""
        asking = asyncio.ensure_future(query)
        try:
            await asyncio.wait({asking, starting}, return_when=asyncio.FIRST_COMPLETED)
            if not asking.done() and starting.exception() is not None:
                starting.result()  # raises the start's error
            reply = await asking
            return reply, await self._ready(starting)
        except (SandboxError, OSError):
            result.num_turns = 0  # as before the overlap: no turn is made without a sandbox
            raise
        finally:
            if not asking.done():
                asking.cancel()
                await asyncio.wait({asking})

    async def _within_wall_clock(self, episode: Awaitable[ExitReason], started: float) -> ExitReason:
        """The episode's end, or WALL_CLOCK when it runs past the episode timeout (and never past the sandbox's
        lifetime), counted from the rollout's start."""
        limits = [self.agent.interaction.episode_timeout, self.agent.env.deployment.deployment_timeout]
        budget = min((x for x in limits if x), default=None)
        try:
            async with asyncio.timeout(budget - (time.monotonic() - started) if budget else None):
                return await episode
        except TimeoutError:
            raise EpisodeEnd(ExitReason.WALL_CLOCK,
                             f"the episode ran past its wall-clock budget of {budget:g} s") from None

    async def _interact(self, conversation: Conversation, starting: asyncio.Task[Sandbox], result: RolloutResult,
                        bound: Any) -> ExitReason:
        interaction = self.agent.interaction
        schemas = tool_schemas([t.name for t in self.agent.tools])
        tools, response_format = self._request_tools(conversation, schemas)
        self._timeouts_left = interaction.timeout_budget
        toolbox: Toolbox | None = None
        for turn in range(1, interaction.max_turns + 1):
            result.num_turns = turn
            self._state("running", turn=turn, max_turns=interaction.max_turns)
            query = self._query(conversation, tools, response_format, result, turn)
            if toolbox is None:
                reply, toolbox = await self._first_turn(query, starting, result)
            else:
                reply = await query
            if await self._execute(reply, conversation, toolbox, result, bound, turn):
                return ExitReason.SUBMITTED
        return ExitReason.MAX_TURNS

    def _request_tools(self, conversation: Conversation, schemas: list[dict]
                       ) -> tuple[list[dict] | None, dict[str, Any] | None]:
        return request_tools(self.agent, conversation, schemas)

    async def _query(self, conversation: Conversation, tools: list[dict] | None,
                     response_format: dict[str, Any] | None, result: RolloutResult, turn: int) -> ChatReply:
        """Ask the model; its reply joins the conversation."""
        reply = await self.model.chat(conversation.messages, tools, response_format, context=self._context)
        self._context = reply.context
        result.llm_s += reply.latency_s
        result.prompt_tokens += reply.prompt_tokens
        result.completion_tokens += reply.completion_tokens
        self._tokens.add(turn, reply.tokens, reply.token_source, reply.tokens_missing)
        conversation.add_reply(reply)
        return reply

    async def _execute(self, reply: ChatReply, conversation: Conversation, toolbox: Toolbox, result: RolloutResult,
                       bound: Any, turn: int) -> bool:
        """Run the reply's tool calls and add their observations; True once one of them submitted."""
        calls, structured = self._parse(reply, toolbox.schemas, conversation)
        for call in calls or []:
            outcome = await toolbox.run(call)
            result.tools_s += outcome.duration_s
            conversation.add_observation(call, outcome.observation, structured)
            bound.debug("tool_call", turn=turn, tool=call.name, status=outcome.status)
            if outcome.submitted:
                return True
            if outcome.status == "timeout":
                self._timeouts_left -= 1
                if self._timeouts_left < 0:
                    budget = self.agent.interaction.timeout_budget
                    raise EpisodeEnd(ExitReason.COMMAND_TIMEOUTS, f"more than {budget} command timeouts")
        return False

    def _parse(self, reply: ChatReply, schemas: list[dict], conversation: Conversation
               ) -> tuple[list[ToolCall] | None, bool]:
        """The reply's tool calls, or None after adding an error observation the model can act on."""
        try:
            if reply.tool_calls:
                return parse_structured(reply.tool_calls, schemas), True
            parsed = parse_text(reply.content, schemas, self.agent.interaction.tool_call_parser)
        except ToolCallFormatError as exc:
            conversation.add_error(reply, f"Error in your tool call: {exc}")
            return None, bool(reply.tool_calls)
        if not parsed.calls:
            conversation.add_no_tool_call_hint()
            return None, False
        return parsed.calls, False

    def _record_tokens(self, result: RolloutResult) -> None:
        """The rollout's training sequence (uni_agent.episode.trajectory) and its mask."""
        self._tokens.fill(result)
        if self.agent.mask_abnormal_exit_traj and result.exit_reason != ExitReason.SUBMITTED:
            # the seed's meaning: a rollout that did not end with `submit` is not trained on
            result.masked, result.mask_reason = True, f"mask_abnormal_exit_traj: exit_reason {result.exit_reason}"
            result.loss_mask = [0] * len(result.loss_mask)


def request_tools(agent: AgentConfig, conversation: Conversation, schemas: list[dict]
                  ) -> tuple[list[dict] | None, dict[str, Any] | None]:
    """The tools as the request carries them (api), or as the system prompt describes them (prompt), and the
    decoding constraint that keeps every reply one valid tool call (constrain_tool_calls)."""
    interaction = agent.interaction
    if interaction.tools_in == "prompt":
        conversation.add_instructions(tool_format_instructions(schemas, interaction.tool_call_parser))
    tools = schemas if interaction.tools_in == "api" else None
    response_format = None
    if interaction.constrain_tool_calls:
        # the chosen format's own schema: config only allows formats that have one
        response_format = {"type": "json_object",
                           "schema": decoding_schema(schemas, interaction.tool_call_parser)}
    return tools, response_format


def opening_request(spec: RolloutSpec) -> tuple[list[dict[str, Any]], list[dict] | None] | None:
    """The first model call's messages and tools when this loop runs the rollout; None for an agent that builds its
    own requests (a harness program). What an engine reads once for all its slots (uni_agent.driver.session)."""
    if not issubclass(import_object(spec.agent.target), UniAgentLoop):
        return None
    return first_request(spec)


def first_request(spec: RolloutSpec) -> tuple[list[dict[str, Any]], list[dict] | None]:
    """The messages and tools of this rollout's first model call: every rollout of its agent begins with the same
    system prompt, which an engine can read once for all its slots (uni_agent.engines.shared_prompt)."""
    conversation = Conversation(spec.prompt, spec.agent.system_prompt)
    tools, _ = request_tools(spec.agent, conversation, tool_schemas([t.name for t in spec.agent.tools]))
    return conversation.messages, tools


async def _started_or_stopped(starting: asyncio.Task[Sandbox] | None) -> Sandbox | None:
    """The started sandbox, or None: a start still in flight is cancelled (start_sandbox closes what it had begun),
    and one that finished as it was cancelled is returned, to be closed like any other."""
    if starting is None:
        return None
    if not starting.done():
        starting.cancel()
        await asyncio.wait({starting})
    if starting.cancelled() or starting.exception() is not None:  # its error, if any, was recorded by run()
        return None
    return starting.result()
