from .units import DIMENSIONS, TEMPERATURE


class UnknownUnitError(ValueError):
    """Raised when a unit symbol is not in any table."""


def dimension_of(unit):
    for name, table in DIMENSIONS.items():
        if unit in table:
            return name
    raise UnknownUnitError(f"unknown unit: {unit!r}")


def _to_kelvin(value, unit):
    scale, offset = TEMPERATURE[unit]
    return value * scale + offset


def _from_kelvin(value, unit):
    scale, offset = TEMPERATURE[unit]
    return value / scale - offset


def convert(value, from_unit, to_unit):
    """Convert ``value`` expressed in ``from_unit`` into ``to_unit``."""
    source = dimension_of(from_unit)
    target = dimension_of(to_unit)
    if source != target:
        raise ValueError(f"cannot convert {source} ({from_unit}) to {target} ({to_unit})")
    if from_unit == to_unit:
        return float(value)
    if source == "temperature":
        return _from_kelvin(_to_kelvin(value, from_unit), to_unit)
    table = DIMENSIONS[source]
    return value * table[from_unit] / table[to_unit]
