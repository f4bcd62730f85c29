"""Find and read one msprobe-format dump: ``dump.json`` with ``construct.json`` and ``stack.json``.

A dump is named by its ``dump.json`` file, by the ``rank`` folder that holds it, or by a dump root
(``OUT/step{N}/rank{R}/``, msprobe's ``proc<pid>`` folders too), in which case the lowest step and
rank are taken (``step=`` and ``rank=`` pick others).

>>> d = find_dump("/work/shared/data/msprobe/torch_L0")          # doctest: +SKIP
>>> raw = read_dump(d)                                             # doctest: +SKIP
>>> len(raw.data), len(raw.construct)                              # doctest: +SKIP
(40, 30)
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probe.errors import ProbeError

_STEP = re.compile(r"^step(\d+)$")
_RANK = re.compile(r"^(?:rank|proc)(\d*)$")


@dataclass
class RawDump:
    """The three msprobe files of one step and rank, as parsed JSON."""

    path: Path                                  # the dump.json file
    data: dict[str, Any]                        # dump.json "data": name -> entry
    construct: dict[str, str | None]            # name -> parent name
    stacks: dict[str, list[str]] = field(default_factory=dict)   # name -> stack lines
    framework: str = ""
    task: str = ""
    level: str = ""


def _numbered(folder: Path, pattern: re.Pattern) -> list[Path]:
    found = []
    for child in folder.iterdir():
        m = pattern.match(child.name)
        if m and child.is_dir():
            found.append((int(m.group(1) or 0), child))
    return [p for _, p in sorted(found)]


def find_dump(path: str | os.PathLike, step: int | None = None, rank: int | None = None) -> Path:
    """The ``dump.json`` named by ``path`` (a file, a rank folder, a step folder or a dump root)."""
    p = Path(path)
    if not p.exists():
        raise ProbeError(f"{p}: no such dump; give a dump.json file or a dump directory")
    if p.is_file():
        if p.name != "dump.json" and p.suffix != ".json":
            raise ProbeError(f"{p}: not a dump.json file")
        return p
    if (p / "dump.json").is_file():
        return p / "dump.json"
    steps = _numbered(p, _STEP)
    if steps:
        pick = [s for s in steps if step is None or s.name == f"step{step}"]
        if not pick:
            raise ProbeError(f"{p}: no step{step} folder (found {', '.join(s.name for s in steps)})")
        p = pick[0]
    ranks = _numbered(p, _RANK)
    if ranks:
        pick = [r for r in ranks if rank is None or r.name in (f"rank{rank}", f"proc{rank}")]
        if not pick:
            raise ProbeError(f"{p}: no rank{rank} folder (found {', '.join(r.name for r in ranks)})")
        if (pick[0] / "dump.json").is_file():
            return pick[0] / "dump.json"
    raise ProbeError(f"{path}: no dump.json found (expected step<N>/rank<R>/dump.json under it)")


def _load_json(path: Path, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ProbeError(f"{path}: invalid JSON in {what} (line {e.lineno}: {e.msg})") from None
    except OSError as e:
        raise ProbeError(f"{path}: cannot read {what} ({e.strerror})") from None


def _stacks(raw: Any) -> dict[str, list[str]]:
    """msprobe writes ``{"0": [[names...], [lines...]], ...}``; older ones ``{name: lines}``."""
    out: dict[str, list[str]] = {}
    if not isinstance(raw, dict):
        return out
    for key, value in raw.items():
        if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], list)
                and isinstance(value[1], list)):
            for name in value[0]:
                out[str(name)] = [str(x) for x in value[1]]
        elif isinstance(value, list):
            out[str(key)] = [str(x) for x in value]
    return out


def read_dump(path: str | os.PathLike, step: int | None = None, rank: int | None = None) -> RawDump:
    """Read the dump named by ``path``; construct.json and stack.json are optional."""
    dump_json = find_dump(path, step, rank)
    doc = _load_json(dump_json, "dump.json")
    if not isinstance(doc, dict) or not isinstance(doc.get("data"), dict):
        raise ProbeError(f"{dump_json}: not an msprobe dump.json (no 'data' object at the top)")
    construct: dict[str, str | None] = {}
    cpath = dump_json.with_name("construct.json")
    if cpath.is_file():
        c = _load_json(cpath, "construct.json")
        if not isinstance(c, dict):
            raise ProbeError(f"{cpath}: expected an object of node -> parent")
        construct = {str(k): (str(v) if v else None) for k, v in c.items()}
    spath = dump_json.with_name("stack.json")
    stacks = _stacks(_load_json(spath, "stack.json")) if spath.is_file() else {}
    return RawDump(path=dump_json, data=doc["data"], construct=construct, stacks=stacks,
                   framework=str(doc.get("framework") or ""), task=str(doc.get("task") or ""),
                   level=str(doc.get("level") or ""))
