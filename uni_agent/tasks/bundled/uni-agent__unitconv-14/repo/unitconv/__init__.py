"""Tiny unit conversion helpers."""
from .core import UnknownUnitError, convert, dimension_of
from .parse import parse_quantity

__all__ = ["UnknownUnitError", "convert", "dimension_of", "parse_quantity"]
__version__ = "0.3.1"
