import pytest

from spanmerge import gaps, merge, overlaps, total_length


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_merge_unsorted_and_touching():
    assert merge([(8, 10), (1, 3), (3, 5)]) == [(1, 5), (8, 10)]
    assert merge([]) == []


def test_merge_rejects_reversed_interval():
    with pytest.raises(ValueError):
        merge([(5, 1)])


def test_overlaps():
    assert overlaps((1, 5), (5, 9))
    assert not overlaps((1, 2), (3, 4))


def test_total_length():
    assert total_length([(0, 2), (1, 4), (10, 11)]) == 5


def test_gaps():
    assert gaps([(2, 3), (5, 7)], 0, 10) == [(0, 2), (3, 5), (7, 10)]
    assert gaps([(0, 10)], 2, 8) == []
