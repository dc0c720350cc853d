import pytest

from unitconv import UnknownUnitError, convert, parse_quantity


def test_length_conversion():
    assert convert(3, "km", "m") == pytest.approx(3000)
    assert convert(12, "in", "ft") == pytest.approx(1)


def test_mass_conversion():
    assert convert(1, "lb", "kg") == pytest.approx(0.45359237)
    assert convert(500, "g", "kg") == pytest.approx(0.5)


def test_celsius_to_kelvin_and_back():
    assert convert(25, "C", "K") == pytest.approx(298.15)
    assert convert(0, "K", "C") == pytest.approx(-273.15)


def test_fahrenheit_to_celsius():
    assert convert(212, "F", "C") == pytest.approx(100)
    assert convert(32, "F", "C") == pytest.approx(0)


def test_incompatible_dimensions():
    with pytest.raises(ValueError):
        convert(1, "kg", "m")


def test_unknown_unit():
    with pytest.raises(UnknownUnitError):
        convert(1, "parsec", "m")


def test_parse_quantity():
    assert parse_quantity("12.5 ft") == (12.5, "ft")
    assert parse_quantity("-3C") == (-3.0, "C")
