from .report import render
from .summary import ColumnSummary, summarize

__all__ = ["ColumnSummary", "render", "summarize"]
