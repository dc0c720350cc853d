def _fmt(value):
    if value is None:
        return "-"
    return f"{value:.2f}"


def render(summaries):
    """Render summaries as a fixed-width text table."""
    header = f"{'column':<12} {'count':>5} {'missing':>7} {'min':>9} {'max':>9} {'mean':>9}"
    lines = [header, "-" * len(header)]
    for s in summaries.values():
        lines.append(
            f"{s.name:<12} {s.count:>5} {s.missing:>7} "
            f"{_fmt(s.minimum):>9} {_fmt(s.maximum):>9} {_fmt(s.mean):>9}"
        )
    return "\n".join(lines)
