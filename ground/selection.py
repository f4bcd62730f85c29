"""Step and rank selections: ``0,2-4`` as msprobe's step and rank lists.

``--steps`` and ``--ranks`` always *select*; counts are ``--nproc`` and ``--max-steps``.

>>> parse_selection("0,2-4")
[0, 2, 3, 4]
"""

from __future__ import annotations

from probe.ground.errors import ProbeError


def parse_selection(text: str | None, *, what: str = "selection") -> list[int] | None:
    """Parse ``"0,2-4"`` into a sorted list of distinct non-negative ints (``None`` stays ``None``).

    >>> parse_selection("3, 1-2")
    [1, 2, 3]
    """
    if text is None:
        return None
    text = str(text).strip()
    if text == "":
        return None
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
                if lo > hi:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ProbeError(
                f"bad {what} {text!r}: use non-negative integers and ranges such as '0,2-4'"
            ) from None
    if any(v < 0 for v in out):
        raise ProbeError(f"bad {what} {text!r}: values must be >= 0, as in '0,2-4'")
    return sorted(out)
