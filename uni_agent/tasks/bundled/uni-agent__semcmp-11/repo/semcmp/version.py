import functools
import re
from dataclasses import dataclass, field

_PATTERN = re.compile(
    r"^v?(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+([0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?$"
)


def _identifier_key(identifier):
    # numeric identifiers sort numerically and before alphanumeric ones
    if identifier.isdigit():
        return (0, int(identifier), "")
    return (1, 0, identifier)


@functools.total_ordering
@dataclass(frozen=True)
class Version:
    major: int
    minor: int
    patch: int
    prerelease: tuple = ()
    build: str = field(default="", compare=False)

    @classmethod
    def parse(cls, text):
        match = _PATTERN.match(text.strip())
        if not match:
            raise ValueError(f"invalid semantic version: {text!r}")
        major, minor, patch, pre, build = match.groups()
        prerelease = tuple(pre.split(".")) if pre else ()
        return cls(int(major), int(minor), int(patch), prerelease, build or "")

    def _key(self):
        pre = tuple(_identifier_key(p) for p in self.prerelease)
        return (self.major, self.minor, self.patch, pre)

    def __lt__(self, other):
        if not isinstance(other, Version):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self):
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(self.prerelease)
        if self.build:
            text += "+" + self.build
        return text

    def bump(self, part):
        if part == "major":
            return Version(self.major + 1, 0, 0)
        if part == "minor":
            return Version(self.major, self.minor + 1, 0)
        if part == "patch":
            return Version(self.major, self.minor, self.patch + 1)
        raise ValueError(f"unknown part: {part!r}")


def latest(versions):
    """Return the highest of an iterable of version strings."""
    return max(Version.parse(v) for v in versions)
