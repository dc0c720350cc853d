from decimal import ROUND_HALF_UP, Decimal

CENT = Decimal("0.01")


def to_money(amount):
    """Convert ``amount`` (str, int or Decimal) to a Decimal rounded to cents."""
    if isinstance(amount, float):
        raise TypeError("use str or Decimal for money, not float")
    return Decimal(amount).quantize(CENT, rounding=ROUND_HALF_UP)
