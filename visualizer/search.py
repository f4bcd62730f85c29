"""Fuzzy, case-insensitive search over node names.

A query matches a name when its characters appear in the name in order (``l1mlpdown`` finds
``Module.layers.1.mlp.down_proj.Linear.forward.0``); a contiguous hit ranks above a scattered
one, and an earlier hit above a later one. Space-separated words must all match.

>>> fuzzy_score("downproj", "Module.layers.1.mlp.down_proj.Linear.forward.0") is not None
True
>>> fuzzy_score("xyz", "Module.embed.Embedding.forward.0") is None
True
>>> rank_matches("qproj", ["a.k_proj", "a.q_proj", "b.q.proj"])
['a.q_proj', 'b.q.proj']
>>> find("proj", ["b.q.proj", "a.pr_oj", "a.q_proj"])
['b.q.proj', 'a.q_proj']
"""

from __future__ import annotations

from typing import Iterable


def fuzzy_score(query: str, text: str) -> float | None:
    """Score of ``query`` in ``text`` (higher is better), or ``None`` when it does not match."""
    total = 0.0
    low = text.lower()
    for word in query.lower().split():
        pos = low.find(word)
        if pos >= 0:
            total += 100.0 + len(word) * 2 - pos * 0.01
            continue
        i, gaps, last = 0, 0, -1
        for ch in word:
            j = low.find(ch, i)
            if j < 0:
                return None
            if last >= 0 and j != last + 1:
                gaps += 1
            last, i = j, j + 1
        total += len(word) - gaps * 2 - last * 0.01
    return total


def rank_matches(query: str, names: Iterable[str], limit: int | None = None) -> list[str]:
    """Names matching ``query``, best first (ties keep the input order)."""
    if not query.strip():
        return []
    scored = []
    for i, name in enumerate(names):
        s = fuzzy_score(query, name)
        if s is not None:
            scored.append((-s, i, name))
    scored.sort()
    out = [name for _, _, name in scored]
    return out[:limit] if limit else out


def find(query: str, names: Iterable[str]) -> list[str]:
    """Matching names in the given order: the names holding every word of ``query`` as a
    substring when there are any, else every fuzzy match (what next/previous steps through)."""
    words = query.lower().split()
    if not words:
        return []
    exact, fuzzy = [], []
    for name in names:
        s = fuzzy_score(query, name)
        if s is None:
            continue
        low = name.lower()
        (exact if all(w in low for w in words) else fuzzy).append(name)
    return exact or fuzzy
