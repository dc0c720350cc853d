"""The graders by name (`reward.name`), and the check that a row's reward can be graded before anything runs.

A new reward type is a class with the Grader protocol's members, passed to `register_grader` (by its module or by
the code that loads it); nothing else changes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..config import ConfigError
from ..swebench.spec import test_list
from .swe_bench import SweBenchGrader
from .swe_local import SweLocalGrader
from .swe_smith import SweSmithGrader
from .terminal_bench import TerminalBenchGrader

if TYPE_CHECKING:
    from ..config import AgentConfig
    from .grader import Grader

_GRADERS: dict[str, Grader] = {}
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")  # a list, or a JSON string of one (never its characters)


def register_grader(grader: Grader) -> Grader:
    """Make `grader` the one for reward.name == grader.name (a later one of the same name replaces it)."""
    _GRADERS[grader.name] = grader
    return grader


def known_graders() -> tuple[str, ...]:
    return tuple(_GRADERS)


def grader_for(name: str | None) -> Grader:
    """The grader registered as `name`; ConfigError naming it and the known ones otherwise."""
    try:
        return _GRADERS[name]  # type: ignore[index]
    except KeyError:
        raise ConfigError(f"reward.name {name!r} is not a known grader; available: {known_graders()}") from None


def check_reward_config(agent: AgentConfig, where: str) -> None:
    """Reject rows whose reward cannot be graded, before anything runs (each error starts with `where`)."""
    reward = agent.reward
    try:
        grader = grader_for(reward.name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    for key in grader.required_metadata:
        if key not in reward.metadata:
            raise ConfigError(f"{where}: reward.metadata lacks {key!r}")
    for key in TEST_LISTS:
        if key in grader.required_metadata:
            try:
                test_list(reward.metadata[key], f"reward.metadata.{key}")
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None
    try:
        grader.check_metadata(reward.metadata)
    except ConfigError as exc:
        raise ConfigError(f"{where}: reward.metadata: {exc}") from None


for _grader in (SweLocalGrader(), SweBenchGrader(), SweSmithGrader(), TerminalBenchGrader()):
    register_grader(_grader)
