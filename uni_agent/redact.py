"""Secrets never leave the process in logs, results or error messages: known secret values and common token shapes
are replaced before anything is written."""

from __future__ import annotations

import re

_registered: set[str] = set()

TOKEN_PATTERNS = [
    re.compile(r"(Bearer\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(r"\b(sk-)[A-Za-z0-9_-]{12,}"),
    re.compile(r"\b(ak-|as-)[A-Za-z0-9]{12,}"),  # Modal token id / secret shapes
]
# Any of the shapes at all: most text has none (the driver redacts every field of every log line, one per recorded
# rollout), and one search is a third of the three substitutions' cost.
_ANY_TOKEN = re.compile("|".join(f"(?:{p.pattern})" for p in TOKEN_PATTERNS))


def register_secret(value: str | None) -> None:
    """Remember a secret (an API key, a token) so that `redact` removes it wherever it appears."""
    if value and len(value) >= 4:
        _registered.add(value)


def redact(text: str) -> str:
    for secret in _registered:
        text = text.replace(secret, "***")
    if _ANY_TOKEN.search(text) is None:
        return text
    for pattern in TOKEN_PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + "***", text)
    return text
