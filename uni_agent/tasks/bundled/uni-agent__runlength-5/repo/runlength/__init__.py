from .codec import decode, encode, runs
from .stats import compression_ratio

__all__ = ["compression_ratio", "decode", "encode", "runs"]
