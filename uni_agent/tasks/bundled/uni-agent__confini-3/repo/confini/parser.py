import re

_SECTION = re.compile(r"^\[([^\]]+)\]$")
_COMMENT_PREFIXES = ("#", ";")


class ParseError(ValueError):
    def __init__(self, message, lineno):
        super().__init__(f"line {lineno}: {message}")
        self.lineno = lineno


def _unquote(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def parse(text):
    """Parse INI-style ``text`` into a ``{section: {key: value}}`` dict.

    Keys are case-insensitive and stored lower-cased.  Values are kept
    as strings; surrounding quotes are removed.
    """
    data = {}
    section = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(_COMMENT_PREFIXES):
            continue
        match = _SECTION.match(line)
        if match:
            section = match.group(1).strip()
            data.setdefault(section, {})
            continue
        if "=" not in line:
            raise ParseError(f"expected 'key = value', got {line!r}", lineno)
        if section is None:
            raise ParseError("key outside of any section", lineno)
        parts = line.split("=")
        key, value = parts[0].strip(), parts[1].strip()
        if not key:
            raise ParseError("empty key", lineno)
        data[section][key.lower()] = _unquote(value)
    return data
