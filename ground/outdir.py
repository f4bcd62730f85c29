"""Output folders: a verb replaces only what it can prove it wrote.

Every verb that writes into ``--out`` first *claims* the top-level entries it is about to write
(``store``, ``step*``, ``trace.json`` ...). The folder keeps a manifest, ``.probe-outputs.json``,
naming which verb wrote which entries. An entry that is already there is removed only when the
manifest says the same verb wrote it; anything else (a file of the user's, another verb's
store, a folder from before manifests) stops the verb with a one-line error, and ``--force``
overrides it. The folder itself is never removed, so ``--out .`` or ``--out ~`` is safe.

>>> import tempfile, os
>>> out = tempfile.mkdtemp()
>>> _ = claim(out, "dump", ["store", "step*"])
>>> os.makedirs(os.path.join(out, "step0"))
>>> _ = claim(out, "dump", ["store", "step*"])      # its own step0: replaced
>>> os.path.exists(os.path.join(out, "step0"))
False
>>> os.makedirs(os.path.join(out, "store"))
>>> try:
...     claim(out, "train", ["store"])
... except ProbeError as e:
...     print(str(e).split(os.sep)[-1])
store was written by 'probe dump', not 'probe train'; choose another --out, or pass --force to replace it
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
from pathlib import Path
from typing import Iterable

from probe.ground.errors import ProbeError

MANIFEST = ".probe-outputs.json"


def _read(root: Path) -> dict:
    path = root / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"entries": {}}
    except (OSError, ValueError):
        raise ProbeError(f"{path}: unreadable output manifest; remove it (and what probe wrote "
                         "beside it) or choose another --out") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
        raise ProbeError(f"{path}: not a probe output manifest; choose another --out")
    return data


def _write(root: Path, data: dict) -> None:
    tmp = root / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, root / MANIFEST)


def _owner(entries: dict[str, str], name: str) -> str | None:
    for pattern, verb in entries.items():
        if fnmatch.fnmatchcase(name, pattern):
            return verb
    return None


def claim(out: str | os.PathLike, verb: str, patterns: Iterable[str], *, force: bool = False) -> Path:
    """Make ``out`` ready for ``verb`` to write the top-level entries matching ``patterns``.

    Creates the folder if needed. Existing entries matching a pattern are removed when the
    manifest says ``verb`` wrote them (or with ``force``); any other match is a ProbeError that
    names it. Returns the folder.
    """
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ProbeError(f"{out}: exists and is not a directory; choose another --out")
    try:
        created = not root.exists()
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProbeError(f"{out}: cannot create the output folder ({e.strerror})") from None
    data = _read(root)
    entries: dict[str, str] = data["entries"]
    if created:
        data["created_by"] = verb
    patterns = list(patterns)
    doomed: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.name in (MANIFEST, MANIFEST + ".tmp"):
            continue
        if not any(fnmatch.fnmatchcase(child.name, p) for p in patterns):
            continue
        owner = _owner(entries, child.name)
        if owner != verb and not force:
            who = f"was written by 'probe {owner}', not 'probe {verb}'" if owner else \
                "was not written by probe (no record of it in the folder's manifest)"
            raise ProbeError(f"{child} {who}; choose another --out, or pass --force to replace it")
        doomed.append(child)
    for child in doomed:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    for pattern in patterns:
        entries[pattern] = verb
    _write(root, data)
    return root


def owner(out: str | os.PathLike, name: str) -> str | None:
    """The verb the manifest of ``out`` names as the writer of its top-level entry ``name``.

    None where no manifest names it (or ``out`` has none).
    """
    root = Path(out)
    return _owner(_read(root)["entries"], name) if root.is_dir() else None


def created_by(out: str | os.PathLike) -> str | None:
    """The verb that created ``out`` (None: it existed before probe wrote into it)."""
    root = Path(out)
    return _read(root).get("created_by") if root.is_dir() else None
