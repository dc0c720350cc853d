import calendar
from datetime import date


def end_of_month(d):
    """Return the last day of ``d``'s month."""
    return d.replace(day=calendar.monthrange(d.year, d.month)[1])


def add_months(d, months):
    """Shift ``d`` by ``months`` calendar months (may be negative).

    If the target month is shorter than ``d.day`` the result is clamped
    to the last day of that month, e.g. Jan 31 + 1 month -> Feb 28/29.
    """
    month = (d.month + months) % 12 or 12
    year = d.year + (d.month + months) // 12
    day = min(d.day, calendar.monthrange(year, month)[1])
    return date(year, month, day)
