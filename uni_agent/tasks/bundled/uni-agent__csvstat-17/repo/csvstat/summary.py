import csv
import io
from dataclasses import dataclass
from typing import Optional


@dataclass
class ColumnSummary:
    name: str
    count: int
    missing: int
    numeric: bool
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    mean: Optional[float] = None


def _to_number(value):
    try:
        return float(value)
    except ValueError:
        return None


def _summarize_column(name, values):
    present = [v for v in values if v != ""]
    numbers = [_to_number(v) for v in present]
    numeric = bool(present) and all(n is not None for n in numbers)
    summary = ColumnSummary(
        name=name,
        count=len(present),
        missing=len(values) - len(present),
        numeric=numeric,
    )
    if numeric:
        summary.minimum = min(numbers)
        summary.maximum = max(numbers)
        summary.mean = sum(numbers) / len(values)
    return summary


def summarize(text, delimiter=","):
    """Return ``{column name: ColumnSummary}`` for CSV ``text`` with a header row."""
    reader = csv.DictReader(io.StringIO(text), delimiter=delimiter)
    names = reader.fieldnames or []
    columns = {name: [] for name in names}
    for row in reader:
        for name in names:
            columns[name].append((row.get(name) or "").strip())
    return {name: _summarize_column(name, values) for name, values in columns.items()}
