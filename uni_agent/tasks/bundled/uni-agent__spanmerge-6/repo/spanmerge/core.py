def _validate(interval):
    start, end = interval
    if start > end:
        raise ValueError(f"interval start is after its end: {interval!r}")
    return start, end


def overlaps(a, b):
    """True if closed intervals ``a`` and ``b`` share at least one point."""
    a_start, a_end = _validate(a)
    b_start, b_end = _validate(b)
    return a_start <= b_end and b_start <= a_end


def merge(intervals):
    """Merge overlapping or touching intervals.

    Returns a new list of disjoint intervals sorted by start.
    """
    merged = []
    for start, end in sorted(_validate(i) for i in intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def total_length(intervals):
    return sum(end - start for start, end in merge(intervals))


def gaps(intervals, lo, hi):
    """Sub-intervals of ``[lo, hi]`` that no interval covers."""
    result = []
    cursor = lo
    for start, end in merge(intervals):
        if end < lo or start > hi:
            continue
        if start > cursor:
            result.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < hi:
        result.append((cursor, hi))
    return result
