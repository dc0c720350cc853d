from .codec import encode


def compression_ratio(text):
    """Length of the encoded form divided by the length of ``text``."""
    if not text:
        return 1.0
    return len(encode(text)) / len(text)
