"""Fingerprints of compare inputs: which dumps a compare result was computed from.

``probe compare`` writes the fingerprint of each input it read into summary.json (``inputs``);
the web recomputes them for the dumps it is given and refuses a result that belongs to others.

A fingerprint depends on content only (not on the path or the modification time): sha256 over
the file's size and its bytes, all of them up to :data:`FULL_BYTES`, beyond that the first and
last MiB and :data:`SAMPLES` blocks of 64 KiB spread evenly between (an 800 MB dump.json: 6 MiB
read, ~10 ms, where the whole file would take ~1 s on this project's machines). Two dumps of
different runs differ in the statistics of every tensor, so a sample tells them apart. A store
folder's fingerprint covers each of its files (relative path, size, content as above).

>>> import os, tempfile
>>> p = os.path.join(tempfile.mkdtemp(), "dump.json")
>>> _ = open(p, "w").write('{"data": {}}')
>>> f = fingerprint(p)
>>> f["bytes"], f["scheme"], len(f["sha256"])
(12, 'full', 64)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

__all__ = ["FULL_BYTES", "SAMPLES", "fingerprint", "same_input", "foreign_input"]

#: Files up to this size are hashed whole.
FULL_BYTES = 16 << 20
#: Blocks of 64 KiB hashed between the first and the last MiB of a larger file.
SAMPLES = 64
_EDGE = 1 << 20
_BLOCK = 64 << 10


def fingerprint(path: str | os.PathLike) -> dict[str, Any]:
    """``{"sha256": hex, "bytes": size, "scheme": "full"|"sampled"}`` of a dump.json, or of a
    store folder (``bytes``: all its files; ``scheme``: ``sampled`` when any file was)."""
    p = Path(path)
    if p.is_dir():
        h = hashlib.sha256()
        total, schemes = 0, set()
        for f in sorted(x for x in p.rglob("*") if x.is_file()):
            one = fingerprint(f)
            total += one["bytes"]
            schemes.add(one["scheme"])
            h.update(f"{f.relative_to(p).as_posix()}\0{one['sha256']}\0".encode())
        return {"sha256": h.hexdigest(), "bytes": total,
                "scheme": "sampled" if "sampled" in schemes else "full"}
    size = p.stat().st_size
    h = hashlib.sha256(f"{size}\0".encode())
    with open(p, "rb") as f:
        if size <= FULL_BYTES:
            for chunk in iter(lambda: f.read(8 << 20), b""):
                h.update(chunk)
            return {"sha256": h.hexdigest(), "bytes": size, "scheme": "full"}
        step = (size - 2 * _EDGE - _BLOCK) // (SAMPLES - 1)
        spots = [(0, _EDGE)] + [(_EDGE + i * step, _BLOCK) for i in range(SAMPLES)] + [(size - _EDGE, _EDGE)]
        for at, n in spots:
            f.seek(at)
            h.update(f.read(n))
    return {"sha256": h.hexdigest(), "bytes": size, "scheme": "sampled"}


def same_input(recorded: Any, path: str | os.PathLike) -> bool:
    """Whether the input at ``path`` is the one a compare result recorded (``recorded``: its
    ``summary["inputs"]["a"]`` or ``["b"]``)."""
    if not isinstance(recorded, dict) or "sha256" not in recorded:
        return False
    now = fingerprint(path)
    return now["sha256"] == recorded["sha256"] and now["bytes"] == recorded.get("bytes")


def foreign_input(summary: dict[str, Any], sources: dict[str, str | os.PathLike]) -> str | None:
    """Why a compare result (its ``summary``) was not computed from the inputs at ``sources``
    (``{"a": path, "b": path}``: the dump.json or store folder of each side), in words; None
    when it was, or when the result is older than fingerprints (nothing to check)."""
    recorded = summary.get("inputs")
    if not isinstance(recorded, dict):
        return None
    for side in ("a", "b"):
        rec = recorded.get(side)
        if not same_input(rec, sources[side]):
            was = rec.get("path") if isinstance(rec, dict) else None
            return (f"its side {side.upper()} was computed from {was or 'another dump'}, "
                    f"not from {sources[side]} (their contents differ)")
    return None
