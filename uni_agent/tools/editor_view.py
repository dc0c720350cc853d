"""How the editor shows a file: lines as `cat -n` prints them, clipped at a character limit with a note on how to see
the rest, and the snippet around an edit. Pure: text in, text out."""

from __future__ import annotations

from .editor_text import split_lines

SNIPPET_CONTEXT_LINES = 4  # lines shown above and below an edit


def render_lines(lines: list[str], start: int, end: int, total: int, max_chars: int) -> str:
    """Lines start..end (1-based) as `cat -n`, clipped at max_chars with a note on how to see the rest."""
    out: list[str] = []
    used = 0
    for number in range(start, end + 1):
        row = f"{number:6}\t{lines[number - 1]}"
        if used + len(row) + 1 > max_chars:
            shown_to = number - 1
            if not out:  # one huge line: show its head rather than nothing
                out.append(row[:max_chars] + " ...")
                shown_to = number
            note = (f"<output clipped at {max_chars} characters: "
                    f"showed lines {start}-{shown_to} of {total}")
            if shown_to < end:
                note += f"; use view_range to see the rest, e.g. view_range=[{shown_to + 1}, {end}]>"
            else:
                note += f"; line {shown_to} itself is too long, read it with a shell command (e.g. cut -c)>"
            out.append(note)
            break
        out.append(row)
        used += len(row) + 1
    return "\n".join(out)


def edit_report(shown: str, new_data: bytes, first: int, last: int, max_chars: int) -> str:
    """What the model reads after an edit of the file it calls `shown`: lines first..last of `new_data` with
    SNIPPET_CONTEXT_LINES around them."""
    lines = split_lines(new_data.decode("utf-8", errors="replace"))
    total = len(lines)
    if total == 0:
        return f"Edited {shown}; the file is now empty. Review the change; undo_edit reverts it."
    last = min(max(last, first), total)
    first = min(first, total)
    start = max(1, first - SNIPPET_CONTEXT_LINES)
    end = min(total, last + SNIPPET_CONTEXT_LINES)
    snippet = render_lines(lines, start, end, total, max_chars)
    return (f"Edited {shown}. Lines {start}-{end} after the edit:\n{snippet}\n"
            "Review the change and check it is what you intended (indentation included); "
            "edit again or use undo_edit to revert it.")
