from .convert import MAX_VALUE, InvalidRomanNumeral, from_roman, to_roman

__all__ = ["MAX_VALUE", "InvalidRomanNumeral", "from_roman", "to_roman"]
