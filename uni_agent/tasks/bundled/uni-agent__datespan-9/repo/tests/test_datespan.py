from datetime import date

import pytest

from datespan import add_months, date_range, end_of_month, month_starts, overlap_days


def test_date_range_is_inclusive():
    days = list(date_range(date(2024, 3, 1), date(2024, 3, 4)))
    assert days == [date(2024, 3, d) for d in (1, 2, 3, 4)]


def test_date_range_step():
    days = list(date_range(date(2024, 3, 1), date(2024, 3, 10), step=4))
    assert days == [date(2024, 3, 1), date(2024, 3, 5), date(2024, 3, 9)]
    with pytest.raises(ValueError):
        list(date_range(date(2024, 3, 1), date(2024, 3, 2), step=0))


def test_add_months_clamps_day():
    assert add_months(date(2024, 1, 31), 1) == date(2024, 2, 29)
    assert add_months(date(2023, 1, 31), 1) == date(2023, 2, 28)


def test_add_months_crosses_year():
    assert add_months(date(2023, 10, 10), 3) == date(2024, 1, 10)
    assert add_months(date(2024, 2, 15), -3) == date(2023, 11, 15)


def test_end_of_month():
    assert end_of_month(date(2024, 2, 3)) == date(2024, 2, 29)


def test_month_starts_within_year():
    assert month_starts(date(2024, 3, 15), date(2024, 5, 2)) == [
        date(2024, 3, 1),
        date(2024, 4, 1),
        date(2024, 5, 1),
    ]


def test_overlap_days():
    assert overlap_days(date(2024, 1, 1), date(2024, 1, 10), date(2024, 1, 8), date(2024, 1, 20)) == 3
    assert overlap_days(date(2024, 1, 1), date(2024, 1, 2), date(2024, 2, 1), date(2024, 2, 2)) == 0
