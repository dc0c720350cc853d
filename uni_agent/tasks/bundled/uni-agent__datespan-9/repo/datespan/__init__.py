from .ranges import date_range, month_starts, overlap_days
from .months import add_months, end_of_month

__all__ = ["add_months", "date_range", "end_of_month", "month_starts", "overlap_days"]
