"""Our own agent loop, as an agent strategy (strategy.py): it only acts. Reads top to bottom.

steps, each a query (ask the model) and an execution (parse its tool calls, run them, add the observations) …
until `submit`, max_turns, or too many command timeouts (an Ending). The first model call is asked while the sandbox
starts. Everything around it (the sandbox's start and post-setup, the wall clock, the context limit and failures as
endings, the patch, the close, redaction, classification, masks) is the envelope's (envelope.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from ..config import AgentConfig
from .conversation import Conversation
from .ending import Ending, EpisodeEnd
from ..events import RolloutState
from .exit_reason import ExitReason
from ..llm import ChatReply, TokenContext
from ..registry import import_object
from .rollout import RolloutSpec
from ..sandbox import SandboxError
from ..sandbox.start import start_sandbox, workspace_patch
from .strategy import AgentStrategy, Episode
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
    from .rollout import RolloutResult

__all__ = ["UniAgentLoop", "first_request", "opening_request", "request_tools", "start_sandbox", "strategy_for",
           "workspace_patch"]


class UniAgentLoop:
    """One rollout of our loop (a fresh one per rollout: it keeps the rollout's conversation, token context and
    command-timeout count)."""

    grace_s = 0.0  # the envelope stops it at the deadline

    def __init__(self, agent: AgentConfig):
        self.agent = agent
        self._conversation: Conversation | None = None
        self._tokens = TokenLog()  # each model call's tokens, as the engine reported them
        self._context: TokenContext | None = None  # llama_server token-in: the ids the next call continues
        self._timeouts_left = 0  # command timeouts the episode may still take (interaction.timeout_budget)

    def sandbox_config(self) -> AgentConfig:
        return self.agent

    def time_limit(self) -> float | None:
        return None  # interaction.episode_timeout, which the envelope applies

    async def act(self, episode: Episode) -> Ending:
        interaction = self.agent.interaction
        conversation = self._conversation = Conversation(episode.spec.prompt, self.agent.system_prompt)
        schemas = tool_schemas([t.name for t in self.agent.tools])
        tools, response_format = request_tools(self.agent, conversation, schemas)
        self._timeouts_left = interaction.timeout_budget
        toolbox: Toolbox | None = None
        for turn in range(1, interaction.max_turns + 1):
            episode.row.num_turns = turn
            episode.state(RolloutState.RUNNING, turn=turn, max_turns=interaction.max_turns)
            query = self._query(episode, conversation, tools, response_format, turn)
            if toolbox is None:
                reply, toolbox = await self._first_turn(query, episode)
            else:
                reply = await query
            if await self._execute(reply, conversation, toolbox, episode, turn):
                return Ending(ExitReason.SUBMITTED)
        return Ending(ExitReason.MAX_TURNS)

    def record(self, row: RolloutResult) -> None:
        """The conversation and the training sequence (uni_agent.episode.trajectory)."""
        if self._conversation is not None:
            row.messages = self._conversation.messages
        self._tokens.fill(row)

    async def _first_turn(self, query: Awaitable[ChatReply], episode: Episode) -> tuple[ChatReply, Toolbox]:
        """The first reply, asked while the sandbox starts, and the tools once it has started and been set up. A start
        that fails before the reply cancels the call: the episode ends with the start's error at once."""
        asking = asyncio.ensure_future(query)
        starting = episode.sandbox.started
        try:
            await asyncio.wait({asking, starting}, return_when=asyncio.FIRST_COMPLETED)
            if not asking.done() and starting.exception() is not None:
                starting.result()  # raises the start's error
            reply = await asking
            sandbox = await episode.sandbox.ready()
            return reply, Toolbox([t.name for t in self.agent.tools], sandbox, self.agent.interaction)
        except (SandboxError, OSError):
            episode.row.num_turns = 0  # as before the overlap: no turn is made without a sandbox
            raise
        finally:
            if not asking.done():
                asking.cancel()
                await asyncio.wait({asking})

    async def _query(self, episode: Episode, conversation: Conversation, tools: list[dict] | None,
                     response_format: dict[str, Any] | None, turn: int) -> ChatReply:
        """Ask the model; its reply joins the conversation."""
        reply = await episode.model.chat(conversation.messages, tools, response_format, context=self._context)
        self._context = reply.context
        row = episode.row
        row.llm_s += reply.latency_s
        row.prompt_tokens += reply.prompt_tokens
        row.completion_tokens += reply.completion_tokens
        self._tokens.add(turn, reply.tokens, reply.token_source, reply.tokens_missing)
        conversation.add_reply(reply)
        return reply

    async def _execute(self, reply: ChatReply, conversation: Conversation, toolbox: Toolbox, episode: Episode,
                       turn: int) -> bool:
        """Run the reply's tool calls and add their observations; True once one of them submitted."""
        calls, structured = self._parse(reply, toolbox.schemas, conversation)
        for call in calls or []:
            outcome = await toolbox.run(call)
            episode.row.tools_s += outcome.duration_s
            conversation.add_observation(call, outcome.observation, structured)
            episode.log.debug("tool_call", turn=turn, tool=call.name, status=outcome.status)
            if outcome.submitted:
                return True
            if outcome.status == "timeout":
                self._timeouts_left -= 1
                if self._timeouts_left < 0:
                    budget = self.agent.interaction.timeout_budget
                    raise EpisodeEnd(Ending(ExitReason.COMMAND_TIMEOUTS, f"more than {budget} command timeouts"))
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


def strategy_class(agent: AgentConfig) -> type:
    """The class the agent config names (`_target_`): this loop when it names none."""
    return UniAgentLoop if agent.target is None else import_object(agent.target)


def strategy_for(agent: AgentConfig) -> AgentStrategy:
    """A fresh strategy of the class the agent config names (`_target_`, this loop when none), built from the
    config."""
    cls = strategy_class(agent)
    refused = TypeError(f"agent {agent.name!r}: {agent.target} is not an agent strategy (uni_agent.episode.strategy."
                        "AgentStrategy: grace_s, sandbox_config, time_limit, act, record)")
    if not all(callable(getattr(cls, method, None)) for method in ("sandbox_config", "time_limit", "act", "record")):
        raise refused  # before it is built: its constructor may want anything but an agent config
    strategy = cls(agent)
    if not isinstance(strategy, AgentStrategy):
        raise refused
    return strategy


def opening_request(spec: RolloutSpec) -> tuple[list[dict[str, Any]], list[dict] | None] | None:
    """The first model call's messages and tools when this loop runs the rollout; None for an agent that builds its
    own requests (a harness program). What an engine reads once for all its slots (uni_agent.driver.session)."""
    if not issubclass(strategy_class(spec.agent), UniAgentLoop):
        return None
    return first_request(spec)


def first_request(spec: RolloutSpec) -> tuple[list[dict[str, Any]], list[dict] | None]:
    """The messages and tools of this rollout's first model call: every rollout of its agent begins with the same
    system prompt, which an engine can read once for all its slots (uni_agent.engines.shared_prompt)."""
    conversation = Conversation(spec.prompt, spec.agent.system_prompt)
    tools, _ = request_tools(spec.agent, conversation, tool_schemas([t.name for t in spec.agent.tools]))
    return conversation.messages, tools
