import pytest

from semcmp import Version, latest


def test_parse():
    v = Version.parse("v1.2.3-beta.2+build.7")
    assert (v.major, v.minor, v.patch) == (1, 2, 3)
    assert v.prerelease == ("beta", "2")
    assert v.build == "build.7"
    assert str(v) == "1.2.3-beta.2+build.7"


def test_invalid_versions():
    for bad in ("1.2", "01.2.3", "1.2.3-", "a.b.c"):
        with pytest.raises(ValueError):
            Version.parse(bad)


def test_numeric_ordering():
    assert Version.parse("1.10.0") > Version.parse("1.9.9")
    assert Version.parse("2.0.0") > Version.parse("1.99.99")


def test_prerelease_identifiers():
    assert Version.parse("1.0.0-alpha.2") < Version.parse("1.0.0-alpha.10")
    assert Version.parse("1.0.0-alpha.9") < Version.parse("1.0.0-alpha.beta")
    assert Version.parse("1.0.0-alpha") < Version.parse("1.0.0-alpha.1")


def test_build_metadata_is_ignored():
    assert Version.parse("1.0.0+a") == Version.parse("1.0.0+b")


def test_bump():
    assert str(Version.parse("1.4.2-rc.1").bump("minor")) == "1.5.0"
