r"""Words for counts in messages, the same in every verb and page; and text from elsewhere made
safe to print: control characters escaped, so a job, host or rank name sent over the network
cannot move the cursor, recolour or clear the user's terminal.

>>> printable("job\x1b[2Jx")
'job\\x1b[2Jx'
>>> printable({"job": "a\nb", "ranks": [{"host": "h\u202e"}], "step": 3})
{'job': 'a\\nb', 'ranks': [{'host': 'h\\u202e'}], 'step': 3}
"""

from __future__ import annotations

import unicodedata
from typing import Any


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 step``, ``2 steps``.

    >>> plural(1, "rank"), plural(3, "step"), plural(0, "entry", "entries")
    ('1 rank', '3 steps', '0 entries')
    """
    return f"{n} {word if n == 1 else (many or word + 's')}"


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(ch, f"\\x{code:02x}")
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value: Any) -> Any:
    """``value`` with every control or format character (Unicode category C: escape sequences,
    newlines, bidirectional overrides) of its strings written as a Python escape; dicts, lists
    and tuples are copied with their strings escaped, anything else is returned as it is."""
    if isinstance(value, str):
        if value.isprintable():
            return value
        return "".join(_escape(c) if unicodedata.category(c).startswith("C") else c for c in value)
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(printable(v) for v in value)
    return value
