def shape(m):
    """Return ``(rows, cols)`` of a row-major matrix."""
    rows = len(m)
    cols = len(m[0]) if rows else 0
    if any(len(row) != cols for row in m):
        raise ValueError("ragged matrix")
    return rows, cols


def identity(n):
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def transpose(m):
    return [list(col) for col in zip(*m)]


def scale(m, factor):
    return [[factor * x for x in row] for row in m]


def add(a, b):
    if shape(a) != shape(b):
        raise ValueError(f"shape mismatch: {shape(a)} vs {shape(b)}")
    return [[x + y for x, y in zip(ra, rb)] for ra, rb in zip(a, b)]


def multiply(a, b):
    """Matrix product ``a @ b``."""
    rows_a, cols_a = shape(a)
    rows_b, cols_b = shape(b)
    if cols_a != rows_b:
        raise ValueError(f"cannot multiply {rows_a}x{cols_a} by {rows_b}x{cols_b}")
    result = []
    for i in range(rows_a):
        row = []
        for j in range(rows_b):
            row.append(sum(a[i][k] * b[k][j] for k in range(cols_a)))
        result.append(row)
    return result


def determinant(m):
    """Determinant by cofactor expansion along the first row."""
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError("determinant needs a square matrix")
    if rows == 1:
        return m[0][0]
    if rows == 2:
        return m[0][0] * m[1][1] - m[0][1] * m[1][0]
    total = 0
    for j in range(cols):
        minor = [row[:j] + row[j + 1:] for row in m[1:]]
        total += (-1) ** j * m[0][j] * determinant(minor)
    return total
