"""The graders by name (`reward.name`), and the check that a row's reward can be graded before anything runs.

A new reward type is a class with the Grader protocol's members. A row names it by import path
(`reward.name: mypkg.graders:MyGrader`, imported where it grades, so it works on every worker that can import
`mypkg`), or by a short name given with `register_grader` in the process that grades. A name that is a class is
instantiated for each use; one that is an instance is used as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..config import ConfigError
from ..registry import Registry, UnknownName, is_import_path
from ..tasks.rows import test_list

if TYPE_CHECKING:
    from ..config import AgentConfig
    from .grader import Grader

GRADERS: Registry[Any] = Registry("grader", {
    "swe_local": "uni_agent.grading.swe_local:SweLocalGrader",
    "swe_bench": "uni_agent.grading.swe_bench:SweBenchGrader",
    "swe_smith": "uni_agent.grading.swe_smith:SweSmithGrader",
    "terminal_bench": "uni_agent.grading.terminal_bench:TerminalBenchGrader",
})
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")  # a list, or a JSON string of one (never its characters)


def register_grader(grader: Grader) -> Grader:
    """Make `grader` the one for reward.name == grader.name (a later one of the same name replaces it)."""
    GRADERS.register(grader.name, grader, replace=True)
    return grader


def known_graders() -> tuple[str, ...]:
    return tuple(GRADERS.names())


def grader_for(name: str | None) -> Grader:
    """The grader `name` names; ConfigError naming it and the known ones otherwise."""
    if not isinstance(name, str) or (name not in GRADERS and not is_import_path(name)):
        raise ConfigError(f"reward.name {name!r} is not a known grader; available: {known_graders()} "
                          "(or package.module:Grader)")
    try:
        grader = GRADERS.get(name)
    except UnknownName as exc:
        raise ConfigError(f"reward.name: {exc}") from None
    return grader() if isinstance(grader, type) else grader


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
