import re

from .core import dimension_of

_QUANTITY = re.compile(r"^\s*([-+]?\d+(?:\.\d+)?)\s*([A-Za-z]+)\s*$")


def parse_quantity(text):
    """Parse strings such as ``"12.5 km"`` into ``(12.5, "km")``."""
    match = _QUANTITY.match(text)
    if not match:
        raise ValueError(f"not a quantity: {text!r}")
    number, unit = match.groups()
    dimension_of(unit)  # validates the unit
    return float(number), unit
