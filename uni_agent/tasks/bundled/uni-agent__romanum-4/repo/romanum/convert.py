MAX_VALUE = 3999

_TABLE = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]

_SYMBOLS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


class InvalidRomanNumeral(ValueError):
    pass


def to_roman(number):
    if not isinstance(number, int) or isinstance(number, bool):
        raise TypeError("expected an int")
    if not 1 <= number <= MAX_VALUE:
        raise ValueError(f"{number} is outside 1..{MAX_VALUE}")
    parts = []
    for value, symbol in _TABLE:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(text):
    numeral = text.strip().upper()
    if not numeral or any(ch not in _SYMBOLS for ch in numeral):
        raise InvalidRomanNumeral(f"not a Roman numeral: {text!r}")
    total = 0
    for i, ch in enumerate(numeral):
        value = _SYMBOLS[ch]
        if i + 1 < len(numeral) and _SYMBOLS[numeral[i + 1]] > value:
            total -= value
        else:
            total += value
    if not 1 <= total <= MAX_VALUE or to_roman(total) != numeral:
        raise InvalidRomanNumeral(f"not a canonical Roman numeral: {text!r}")
    return total
