"""Why an episode ended: one enum, written to every result row and event, and read back from stored rows.

A stored row may carry `timeout_budget`, a retired name that covered both "too many command timeouts" and "out of
wall-clock time"; `migrate_exit_reason` maps it to one of the two by the error text written with it, so every reader
sees only current names. Nothing else is imported here: the dashboard's fold and the Parquet readers both use it.
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


EXIT_REASONS: tuple[str, ...] = tuple(reason.value for reason in ExitReason)

# An older row's `timeout_budget` was a wall-clock end when its error said so (agent_loop wrote "... ran past its
# wall-clock budget of N s"), else too many command timeouts ("more than N command timeouts").
OLD_EXIT_REASONS: tuple[str, ...] = ("timeout_budget",)  # names no version writes any more
_WALL_CLOCK_MARK = "wall-clock"


def migrate_exit_reason(reason: object, error: object = None) -> object:
    """The current name of an exit reason an older version wrote; any other value (current names, null) as is."""
    if reason not in OLD_EXIT_REASONS:
        return reason
    if isinstance(error, str) and _WALL_CLOCK_MARK in error:
        return ExitReason.WALL_CLOCK.value
    return ExitReason.COMMAND_TIMEOUTS.value
