"""A registry: things of one kind (tools, tool-call formats, engines) found by name.

Entries are either the object itself or a "module:attribute" path imported on first use, so a registry can list and
check names (config validation) without importing what the entries need (a sandbox, an HTTP client). Adding one is one
`register` call or one line in the registry's table. Imports nothing of uni_agent: every layer may use it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name no entry of the registry has; the message names it and lists the known names."""


class Registry(Generic[T]):
    def __init__(self, kind: str, entries: Mapping[str, T | str] | None = None):
        self.kind = kind  # how the error message calls an entry: "tool", "engine", ...
        self._entries: dict[str, T | str] = dict(entries or {})

    def register(self, name: str, entry: T | str, *, replace: bool = False) -> None:
        """Add `entry` (the object, or "module:attribute") under `name`; an existing name needs replace=True."""
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = entry

    def unregister(self, name: str) -> None:
        self.check(name)
        del self._entries[name]

    def names(self) -> list[str]:
        """The names in registration order (the order defaults are listed in)."""
        return list(self._entries)

    def check(self, name: str) -> str:
        """`name` if registered, else UnknownName naming it and listing the known ones."""
        if name not in self._entries:
            known = ", ".join(self._entries) or "(none)"
            raise UnknownName(f"unknown {self.kind} {name!r}; known {self.kind}s: {known}")
        return name

    def get(self, name: str) -> T:
        """The entry of `name`, imported now if it was registered by path."""
        entry = self._entries[self.check(name)]
        if isinstance(entry, str):
            module, _, attribute = entry.partition(":")
            entry = getattr(importlib.import_module(module), attribute)
            self._entries[name] = entry
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
