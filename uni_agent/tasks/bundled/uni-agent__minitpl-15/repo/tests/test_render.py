import pytest

from minitpl import TemplateError, render


class User:
    def __init__(self, name):
        self.name = name


def test_simple_substitution():
    assert render("Hello {{ name }}!", {"name": "World"}) == "Hello World!"
    assert render("{{a}}{{ b }}", {"a": 1, "b": 2}) == "12"


def test_dotted_lookup_dict_and_attribute():
    ctx = {"user": User("ada"), "site": {"title": "Docs"}}
    assert render("{{ user.name }} @ {{ site.title }}", ctx) == "ada @ Docs"


def test_missing_name_renders_empty():
    assert render("[{{ nope }}]", {}) == "[]"
    assert render("[{{ user.email }}]", {"user": User("x")}) == "[]"


def test_strict_mode_raises():
    with pytest.raises(TemplateError):
        render("{{ nope }}", {}, strict=True)


def test_filters():
    assert render("{{ name | title }}", {"name": "ada lovelace"}) == "Ada Lovelace"
    assert render("{{ name|upper }}", {"name": "x"}) == "X"
    with pytest.raises(TemplateError):
        render("{{ name | reverse }}", {"name": "x"})
