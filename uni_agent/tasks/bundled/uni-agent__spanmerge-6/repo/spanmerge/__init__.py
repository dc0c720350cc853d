from .core import gaps, merge, overlaps, total_length

__all__ = ["gaps", "merge", "overlaps", "total_length"]
