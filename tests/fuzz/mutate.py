"""Seeded mutations of input files: bytes, and the structure of JSON and YAML documents.

Every function takes a ``random.Random`` and returns new bytes (or a new document), so a case
is reproduced from its seed alone. Byte mutations: :func:`flip_bytes`, :func:`truncate`,
:func:`delete_span`, :func:`insert_garbage`. Document mutations (:func:`mutate_doc`, on the
parsed JSON/YAML, written back by :func:`dump_json`): a key deleted, a value's type swapped, a
number made huge or negative, a value nested thousands deep, an entry renamed to odd or
non-ASCII text, a key or entry duplicated.

>>> import random
>>> len(truncate(random.Random(1), b"0123456789")) < 10
True
"""

from __future__ import annotations

import json
import random
from typing import Any

#: Numbers that overflow or underflow what a reader holds (as JSON literals).
HUGE_NUMBERS = ("18446744073709551616", "-9223372036854775809", "1e308", "-1e308", "1e999",
                "-1e999", "1" + "0" * 400, "-1", "0", "NaN", "Infinity", "-Infinity", "4.5",
                "1e-320")
#: Values of every JSON type, to swap in for another value.
ODD_VALUES: tuple[Any, ...] = (None, True, False, 0, -7, 2.5, "", "x", "torch.float32", [], {},
                               [1, "a", None], {"a": 1}, {"dtype": 3, "shape": "x"},
                               [{"type": "int", "value": 3}])
#: Entry names a dump never has: empty, dots only, non-ASCII, control characters, huge.
ODD_NAMES = ("", ".", "....", "Module..forward.0", "Module.a.Linear.forward.-1",
             "Module.a.Linear.forward.99999999999999999999", "Module.\u00e9\u4e2d.Linear.forward.0",
             "Module.a\nb.Linear.forward.0", "Module.a\"b\\.Linear.backward.0",
             "Module.\U0001F600.Conv2d.parameters_grad", "Distributed.all_reduce.0.forward",
             "Torch.matmul.0.sideways", "Cell.\u0000.Dense.forward.0", "x" * 5000,
             "Module." + "a." * 300 + "Linear.forward.0", "Functional.linear.0.forward.extra")


def flip_bytes(rng: random.Random, raw: bytes) -> bytes:
    """1 to 8 random bits flipped (or bytes replaced)."""
    out = bytearray(raw)
    for _ in range(rng.randint(1, 8)):
        i = rng.randrange(len(out))
        out[i] = out[i] ^ (1 << rng.randrange(8)) if rng.random() < 0.7 else rng.randrange(256)
    return bytes(out)


def truncate(rng: random.Random, raw: bytes) -> bytes:
    """Cut at a random point (the tail of a file a crashed writer left)."""
    return raw[:rng.randrange(len(raw))]


def delete_span(rng: random.Random, raw: bytes) -> bytes:
    """A random span of up to 200 bytes removed."""
    i = rng.randrange(len(raw))
    return raw[:i] + raw[i + rng.randint(1, 200):]


def insert_garbage(rng: random.Random, raw: bytes) -> bytes:
    """Up to 64 random bytes inserted at a random point."""
    i = rng.randrange(len(raw) + 1)
    return raw[:i] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + raw[i:]


BYTE_MUTATIONS = (flip_bytes, truncate, delete_span, insert_garbage)


def mutate_bytes(rng: random.Random, raw: bytes) -> bytes:
    """One of the byte mutations, chosen by ``rng``."""
    return rng.choice(BYTE_MUTATIONS)(rng, raw)


class Raw:
    """A JSON literal written as is (a number no float holds, a nesting too deep to build)."""

    def __init__(self, text: str) -> None:
        self.text = text


class Dup:
    """An object written with one of its keys twice (the first value is the decoy)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def _containers(doc: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) slot of ``doc`` (dicts by key, lists by index), outermost first."""
    out, stack = [], [doc]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                out.append((node, k))
                stack.append(v)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                out.append((node, i))
                stack.append(v)
    return out


def _numbers(doc: Any) -> list[tuple[Any, Any]]:
    return [(c, k) for c, k in _containers(doc)
            if isinstance(c[k], (int, float)) and not isinstance(c[k], bool)]


def _nested(rng: random.Random) -> Raw:
    depth = rng.choice((40, 300, 990, 5000, 100_000))
    opener, closer = rng.choice((("[", "]"), ('{"a":', "}")))
    return Raw(opener * depth + "1" + closer * depth)


def mutate_doc(rng: random.Random, doc: Any, names_at: dict | None = None) -> Any:
    """One structural mutation of the parsed document ``doc`` (changed in place and returned);
    ``names_at``, when given, is the object whose keys are entry names (dump.json's ``data``)."""
    slots = _containers(doc)
    kind = rng.choice(("delete", "swap", "number", "nest", "rename", "duplicate"))
    if kind == "number" and _numbers(doc):
        c, k = rng.choice(_numbers(doc))
        c[k] = Raw(rng.choice(HUGE_NUMBERS))
    elif kind == "rename" and isinstance(names_at, dict) and names_at:
        old = rng.choice(list(names_at))
        value = names_at.pop(old)
        lone_surrogate = Raw('"Module.\\ud800.Linear.forward.0"')
        names_at[rng.choice(ODD_NAMES) if rng.random() < 0.8 else lone_surrogate] = value
    elif kind == "duplicate":
        targets = [(c, k) for c, k in slots if isinstance(c[k], dict) and c[k]]
        if isinstance(doc, dict) and doc:
            targets.append((None, None))
        if targets:
            c, k = rng.choice(targets)
            target = doc if c is None else c[k]
            pairs = [(rng.choice(list(target)), rng.choice(ODD_VALUES))] + list(target.items())
            if c is None:
                return Dup(pairs)
            c[k] = Dup(pairs)
    elif kind == "nest" and slots:
        c, k = rng.choice(slots)
        c[k] = _nested(rng)
    elif kind == "delete" and slots:
        c, k = rng.choice([s for s in slots if isinstance(s[0], dict)] or slots)
        del c[k]
    elif slots:
        c, k = rng.choice(slots)
        c[k] = rng.choice(ODD_VALUES)
    return doc


def dump_json(doc: Any) -> bytes:
    """``doc`` as JSON text, :class:`Raw` literals and :class:`Dup` duplicated keys included
    (NaN and Infinity written as msprobe writes them)."""
    parts: list[str] = []

    def key(k: Any) -> str:
        return k.text if isinstance(k, Raw) else json.dumps(str(k))

    def write(v: Any) -> None:
        if isinstance(v, Raw):
            parts.append(v.text)
        elif isinstance(v, (dict, Dup)):
            items = v.pairs if isinstance(v, Dup) else list(v.items())
            parts.append("{")
            for i, (k, x) in enumerate(items):
                parts.append((", " if i else "") + key(k) + ": ")
                write(x)
            parts.append("}")
        elif isinstance(v, list):
            parts.append("[")
            for i, x in enumerate(v):
                if i:
                    parts.append(", ")
                write(x)
            parts.append("]")
        else:
            parts.append(json.dumps(v))
    write(doc)
    return "".join(parts).encode()
