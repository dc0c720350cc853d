from datetime import timedelta

from .months import add_months


def date_range(start, end, step=1):
    """Yield dates from ``start`` to ``end`` inclusive, ``step`` days apart."""
    if step < 1:
        raise ValueError("step must be a positive number of days")
    current = start
    while current <= end:
        yield current
        current += timedelta(days=step)


def month_starts(start, end):
    """Return the first day of every month between ``start`` and ``end``."""
    current = start.replace(day=1)
    result = []
    while current <= end:
        result.append(current)
        current = add_months(current, 1)
    return result


def overlap_days(a_start, a_end, b_start, b_end):
    """Number of days shared by two inclusive date ranges."""
    start = max(a_start, b_start)
    end = min(a_end, b_end)
    return max((end - start).days + 1, 0)
