def runs(text):
    """Group ``text`` into ``(char, count)`` pairs of consecutive characters."""
    result = []
    for ch in text:
        if result and result[-1][0] == ch:
            result[-1] = (ch, result[-1][1] + 1)
        else:
            result.append((ch, 1))
    return result


def encode(text):
    """Encode ``text`` as ``<count><char>`` pairs, e.g. ``"aaab"`` -> ``"3a1b"``."""
    if any(ch.isdigit() for ch in text):
        raise ValueError("digits cannot be run-length encoded")
    return "".join(f"{count}{ch}" for ch, count in runs(text))


def decode(data):
    """Inverse of :func:`encode`."""
    out = []
    i = 0
    while i < len(data):
        if not data[i].isdigit():
            raise ValueError(f"expected a count at position {i} of {data!r}")
        count = int(data[i])
        i += 1
        if i >= len(data):
            raise ValueError(f"count without a character at the end of {data!r}")
        out.append(data[i] * count)
        i += 1
    return "".join(out)
