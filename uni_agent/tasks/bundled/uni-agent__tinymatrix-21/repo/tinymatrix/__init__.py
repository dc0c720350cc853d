from .ops import add, determinant, identity, multiply, scale, shape, transpose

__all__ = ["add", "determinant", "identity", "multiply", "scale", "shape", "transpose"]
