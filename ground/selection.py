"""Step and rank selections: ``0,2-4`` as msprobe's step and rank lists.

``--steps`` and ``--ranks`` always *select*; counts are ``--nproc`` and ``--max-steps``.

>>> parse_selection("0,2-4")
[0, 2, 3, 4]
"""

from __future__ import annotations

from probe.ground.errors import ProbeError

#: the most values one selection may name (``0-1000000000`` would be a billion-element list)
MAX_SELECTION = 1_000_000


def parse_selection(text: str | None, *, what: str = "selection",
                    limit: int | None = None) -> list[int] | None:
    """Parse ``"0,2-4"`` into a sorted list of distinct non-negative ints (``None`` stays ``None``).

    A selection of more than ``limit`` values (default :data:`MAX_SELECTION`) is a ProbeError.

    >>> parse_selection("3, 1-2")
    [1, 2, 3]
    >>> parse_selection("0-1000000000", what="--steps")
    Traceback (most recent call last):
    ...
    probe.ground.errors.ProbeError: bad --steps '0-1000000000': selects more than 1000000 values; select fewer
    """
    limit = MAX_SELECTION if limit is None else limit
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
                if hi - lo + 1 > limit:
                    raise _too_many(what, text, limit)
                out.update(range(lo, hi + 1))
            else:
                out.add(int(part))
        except ValueError:
            raise ProbeError(
                f"bad {what} {text!r}: use non-negative integers and ranges such as '0,2-4'"
            ) from None
        if len(out) > limit:
            raise _too_many(what, text, limit)
    if any(v < 0 for v in out):
        raise ProbeError(f"bad {what} {text!r}: values must be >= 0, as in '0,2-4'")
    return sorted(out)


def _too_many(what: str, text: str, limit: int) -> ProbeError:
    return ProbeError(f"bad {what} {text!r}: selects more than {limit} values; select fewer")


def format_selection(values: list[int]) -> str:
    """Sorted ``values`` written as a selection is (:func:`parse_selection`'s form).

    >>> format_selection([0, 1, 2, 5, 7, 8])
    '0-2,5,7-8'
    """
    parts, start = [], None
    for i, v in enumerate(values):
        if start is None:
            start = v
        if i + 1 == len(values) or values[i + 1] != v + 1:
            parts.append(str(start) if start == v else f"{start}-{v}")
            start = None
    return ",".join(parts)
