"""Why an episode ended: one enum, written to every result row and event. Its values are the strings the Parquet
column and the events carry. Nothing else is imported here: the dashboard's fold and the Parquet readers both use it.
"""

from __future__ import annotations

from enum import StrEnum


class ExitReason(StrEnum):
    SUBMITTED = "submitted"  # the model called `submit`
    MAX_TURNS = "max_turns"  # interaction.max_turns model calls without a submit
    CONTEXT_LIMIT = "context_limit"  # the conversation outgrew the model's context window
    COMMAND_TIMEOUTS = "command_timeouts"  # more than interaction.timeout_budget commands ran past action_timeout
    WALL_CLOCK = "wall_clock"  # past interaction.episode_timeout (or the sandbox's deployment_timeout)
    PROGRAM_FAILED = "program_failed"  # a harness program (uni_agent.harness) exited with a non-zero code
    ERROR = "error"  # the sandbox, the LLM endpoint or the loop itself failed (failures.py says which)
    # The episode ran out of wall-clock time while every engine it could call was down (failures.py): the outage's
    # time, not the model's; an infra row that a rerun runs again
    ENGINE_DOWN = "engine_down"
    # Its caller cancelled it before it finished (the online service's trainer): an event's end, never a row's
    CANCELLED = "cancelled"


# The reasons a result row can carry (a cancelled rollout has no row): the summary counts each of them
EXIT_REASONS: tuple[str, ...] = tuple(reason.value for reason in ExitReason if reason != ExitReason.CANCELLED)
