import pytest

from lrukit import LRUCache, memoize


def test_get_and_put():
    cache = LRUCache(2)
    cache.put("a", 1)
    assert cache.get("a") == 1
    assert cache.get("missing", "dflt") == "dflt"
    assert (cache.hits, cache.misses) == (1, 1)


def test_evicts_least_recently_used():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)
    assert "a" not in cache
    assert cache.keys() == ["b", "c"]


def test_get_refreshes_recency():
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.get("a")
    cache.put("c", 3)
    assert cache.keys() == ["a", "c"]


def test_invalid_capacity():
    with pytest.raises(ValueError):
        LRUCache(0)


def test_memoize():
    calls = []

    @memoize(maxsize=2)
    def square(x):
        calls.append(x)
        return x * x

    assert [square(2), square(2), square(3)] == [4, 4, 9]
    assert calls == [2, 3]
    assert square.cache.hits == 1
