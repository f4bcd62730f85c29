"""Words for counts in messages, the same in every verb and page."""

from __future__ import annotations


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 step``, ``2 steps``.

    >>> plural(1, "rank"), plural(3, "step"), plural(0, "entry", "entries")
    ('1 rank', '3 steps', '0 entries')
    """
    return f"{n} {word if n == 1 else (many or word + 's')}"
