import pytest

from romanum import InvalidRomanNumeral, from_roman, to_roman


def test_to_roman_small_numbers():
    assert [to_roman(n) for n in (1, 4, 9, 14, 40, 90)] == ["I", "IV", "IX", "XIV", "XL", "XC"]


def test_to_roman_large_numbers():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(3999) == "MMMCMXCIX"


def test_to_roman_out_of_range():
    with pytest.raises(ValueError):
        to_roman(0)
    with pytest.raises(ValueError):
        to_roman(4000)
    with pytest.raises(TypeError):
        to_roman(True)


def test_from_roman():
    assert from_roman("MCMXCIV") == 1994
    assert from_roman(" mmxxiv ") == 2024


def test_from_roman_rejects_non_canonical():
    for bad in ("IIII", "VX", "IC", "", "ABC"):
        with pytest.raises(InvalidRomanNumeral):
            from_roman(bad)
