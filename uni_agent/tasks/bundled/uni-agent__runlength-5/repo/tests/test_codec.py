import pytest

from runlength import compression_ratio, decode, encode, runs


def test_runs():
    assert runs("aaabcc") == [("a", 3), ("b", 1), ("c", 2)]


def test_encode():
    assert encode("aaabcc") == "3a1b2c"
    assert encode("") == ""


def test_decode():
    assert decode("3a1b2c") == "aaabcc"
    assert decode("") == ""


def test_roundtrip_short_runs():
    text = "hello   wooorld!!"
    assert decode(encode(text)) == text


def test_digits_are_rejected():
    with pytest.raises(ValueError):
        encode("room 101")


def test_decode_rejects_malformed_input():
    with pytest.raises(ValueError):
        decode("a3")
    with pytest.raises(ValueError):
        decode("3")


def test_compression_ratio():
    assert compression_ratio("aaaa") == 0.5
    assert compression_ratio("") == 1.0
