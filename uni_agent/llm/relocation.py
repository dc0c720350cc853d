"""Where a run's engine serves now. An engine whose worker left is placed again on another worker
(uni_agent.engines.replace) and serves at a new URL there; the agents keep the URL they were given as the engine's
name, and their clients look up its current address here before each request.

The driver publishes each move to every worker process (a worker plugin, so a worker that joins later gets them too).
Moves are scoped by the run's engine key (a digest of it, never the key): a later run on the same cluster whose
engine happens to bind the same host and port is not redirected by an earlier run's moves.
"""

from __future__ import annotations

import hashlib

_moves: dict[tuple[str, str], str] = {}  # (scope, the engine's first URL) -> its URL now


def scope_of(api_key: str | None) -> str:
    """The scope of the moves of the engines that answer `api_key` (a run's engines share one key)."""
    return hashlib.sha256((api_key or "").encode()).hexdigest()[:16]


def current_url(scope: str, url: str) -> str:
    """Where the engine first started at `url` serves now (`url` itself unless it moved)."""
    return _moves.get((scope, url), url) if _moves else url


def record_moves(scope: str, moves: dict[str, str]) -> None:
    """Engines of `scope` moved: first URL -> URL now (the whole table of the run: later entries replace earlier)."""
    for first, now in moves.items():
        _moves[(scope, first.rstrip("/"))] = now.rstrip("/")


def forget_moves(scope: str) -> None:
    """The run of `scope` ended: its moves are of no use (and must not redirect anyone) any more."""
    for key in [k for k in _moves if k[0] == scope]:
        del _moves[key]
