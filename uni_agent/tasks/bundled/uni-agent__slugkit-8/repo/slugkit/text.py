import re

_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def camel_to_snake(name):
    """``"parseHTTPResponse"`` -> ``"parse_http_response"``."""
    return _BOUNDARY.sub("_", name).lower()


def truncate_words(text, count, ellipsis="..."):
    words = text.split()
    if len(words) <= count:
        return " ".join(words)
    return " ".join(words[:count]) + ellipsis
