import pytest

from confini import Config, ParseError, parse

SAMPLE = """
; global settings
[server]
host = example.org
Port = 8080
debug = yes

# paths
[paths]
root = "/srv/app"
"""


def test_sections_and_keys():
    data = parse(SAMPLE)
    assert data == {
        "server": {"host": "example.org", "port": "8080", "debug": "yes"},
        "paths": {"root": "/srv/app"},
    }


def test_key_outside_section_is_an_error():
    with pytest.raises(ParseError) as info:
        parse("name = value\n")
    assert info.value.lineno == 1


def test_line_without_equals_is_an_error():
    with pytest.raises(ParseError):
        parse("[a]\njust some words\n")


def test_typed_getters():
    cfg = Config.from_text(SAMPLE)
    assert cfg.get_int("server", "port") == 8080
    assert cfg.get_bool("server", "debug") is True
    assert cfg.get("server", "missing", "x") == "x"
    assert cfg.sections() == ["server", "paths"]
