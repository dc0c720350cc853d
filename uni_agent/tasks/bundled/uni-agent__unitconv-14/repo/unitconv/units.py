"""Unit tables.

Linear units are stored as the factor that turns one unit into the base
unit of its dimension (metre, kilogram).  Temperatures are stored as a
``(scale, offset)`` pair such that ``kelvin = value * scale + offset``.
"""

LENGTH = {
    "mm": 0.001,
    "cm": 0.01,
    "m": 1.0,
    "km": 1000.0,
    "in": 0.0254,
    "ft": 0.3048,
    "yd": 0.9144,
    "mi": 1609.344,
}

MASS = {
    "mg": 1e-6,
    "g": 0.001,
    "kg": 1.0,
    "oz": 0.028349523125,
    "lb": 0.45359237,
}

TEMPERATURE = {
    "K": (1.0, 0.0),
    "C": (1.0, 273.15),
    "F": (5.0 / 9.0, 459.67 * 5.0 / 9.0),
}

DIMENSIONS = {
    "length": LENGTH,
    "mass": MASS,
    "temperature": TEMPERATURE,
}
