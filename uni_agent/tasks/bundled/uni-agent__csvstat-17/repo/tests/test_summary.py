import pytest

from csvstat import render, summarize

DATA = """city,population,area
Oslo,709000,454
Bergen,289000,465
Trondheim,212000,342
"""


def test_numeric_column():
    s = summarize(DATA)["population"]
    assert s.numeric is True
    assert (s.count, s.missing) == (3, 0)
    assert s.minimum == 212000
    assert s.maximum == 709000
    assert s.mean == pytest.approx(403333.333, rel=1e-6)


def test_text_column_is_not_numeric():
    s = summarize(DATA)["city"]
    assert s.numeric is False
    assert s.mean is None


def test_missing_values_are_counted():
    s = summarize("a,b\n1,\n,x\n3,y\n")["b"]
    assert (s.count, s.missing) == (2, 1)


def test_semicolon_delimiter():
    s = summarize("x;y\n1;2\n3;4\n", delimiter=";")["y"]
    assert (s.minimum, s.maximum) == (2, 4)


def test_render_table():
    table = render(summarize(DATA))
    lines = table.splitlines()
    assert lines[0].split() == ["column", "count", "missing", "min", "max", "mean"]
    assert lines[3].split()[:3] == ["population", "3", "0"]
