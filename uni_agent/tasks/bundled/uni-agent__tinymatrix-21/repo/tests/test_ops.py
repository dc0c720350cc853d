import pytest

from tinymatrix import add, determinant, identity, multiply, scale, shape, transpose


def test_shape_and_identity():
    assert shape([[1, 2, 3], [4, 5, 6]]) == (2, 3)
    assert identity(2) == [[1, 0], [0, 1]]


def test_transpose_rectangular():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_add_and_scale():
    assert add([[1, 2]], [[3, 4]]) == [[4, 6]]
    assert scale([[1, 2]], 3) == [[3, 6]]
    with pytest.raises(ValueError):
        add([[1, 2]], [[1], [2]])


def test_multiply_square():
    a = [[1, 2], [3, 4]]
    b = [[5, 6], [7, 8]]
    assert multiply(a, b) == [[19, 22], [43, 50]]
    assert multiply(a, identity(2)) == a


def test_multiply_incompatible_shapes():
    with pytest.raises(ValueError):
        multiply([[1, 2, 3]], [[1, 2, 3]])


def test_determinant():
    assert determinant([[4, 6], [3, 8]]) == 14
    assert determinant([[6, 1, 1], [4, -2, 5], [2, 8, 7]]) == -306
