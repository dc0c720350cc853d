"""How an episode ended, as a value: an Ending is what an agent strategy returns, and what EpisodeEnd carries when the
end comes from deep inside it (too many command timeouts). The envelope (envelope.py) turns the exceptions that end
an episode (the model endpoint's, the sandbox's, its own wall clock) into Endings too, so a row's exit reason, error
and infra failure are set in one place (RolloutResult.end)."""

from __future__ import annotations

from dataclasses import dataclass

from .exit_reason import ExitReason
from .failures import FailedPart


@dataclass(frozen=True)
class Ending:
    reason: ExitReason
    error: str | None = None  # what ended it, when it was not the agent's own choice (None after a submit)
    failed: FailedPart | None = None  # the part of the infrastructure that failed, when one did

    def __post_init__(self) -> None:
        object.__setattr__(self, "reason", ExitReason(self.reason))
        if self.failed is not None:
            object.__setattr__(self, "failed", FailedPart(self.failed))


def infra_failure(part: FailedPart, exc: BaseException | str) -> Ending:
    """An episode ended by a failure of `part` (an exception, named by its type, or a message)."""
    error = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return Ending(ExitReason.ERROR, error, part)


class EpisodeEnd(Exception):
    """Ends the episode from anywhere inside a strategy with `ending` (the message is its error)."""

    def __init__(self, ending: Ending):
        super().__init__(ending.error or ending.reason.value)
        self.ending = ending
