"""A registry: things of one kind (tools, tool-call formats, graders, sandbox backends, engines) found by name.

Entries are either the object itself or a "module:attribute" path imported on first use, so a registry can list and
check names (config validation) without importing what the entries need (a sandbox, an HTTP client). Adding one is one
`register` call or one line in the registry's table.

Every registry also takes an import path where a name goes: "package.module:Object" names the object itself. Such a
name travels with the config to the worker processes and is imported there, so an extension outside the package
works on every worker that can import its module (a `register` call reaches only the process that made it).
Imports nothing of uni_agent: every layer may use it.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownName(ValueError):
    """A name no entry of the registry has; the message names it and lists the known names."""


IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")  # package.module:Object (or Object.attribute)


def is_import_path(name: str) -> bool:
    return bool(IMPORT_PATH.fullmatch(name))


def import_object(path: str) -> Any:
    """The object at "package.module:Object"; "package.module.Object" (the `_target_` spelling) works too."""
    module, colon, attribute = path.partition(":")
    if not colon:
        module, _, attribute = path.rpartition(".")
    value: Any = importlib.import_module(module)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


class Registry(Generic[T]):
    def __init__(self, kind: str, entries: Mapping[str, T | str] | None = None):
        self.kind = kind  # how the error message calls an entry: "tool", "engine", ...
        self._entries: dict[str, T | str] = dict(entries or {})
        self._paths: dict[str, T] = {}  # objects named by import path, imported in this process

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
        """`name` if registered or an import path that imports, else UnknownName saying why."""
        if name in self._entries:
            return name
        if isinstance(name, str) and is_import_path(name):
            self._imported(name)
            return name
        known = ", ".join(self._entries) or "(none)"
        raise UnknownName(f"unknown {self.kind} {name!r}; known {self.kind}s: {known} (or package.module:Object)")

    def get(self, name: str) -> T:
        """The entry of `name` (imported now if it was registered by path), or the object an import path names."""
        if name not in self._entries:
            return self._imported(self.check(name))
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = import_object(entry)
            self._entries[name] = entry
        return entry

    def _imported(self, path: str) -> T:
        if path not in self._paths:
            try:
                self._paths[path] = import_object(path)
            except (ImportError, AttributeError) as exc:
                raise UnknownName(f"cannot import {self.kind} {path!r}: {type(exc).__name__}: {exc}") from None
        return self._paths[path]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
