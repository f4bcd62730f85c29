"""Output folders: a verb replaces only what it can prove it wrote.

Every verb that writes into ``--out`` first *claims* the top-level entries it is about to write,
as patterns (``store``, ``step[0-9]*``, ``trace.json`` ...). The folder keeps a manifest,
``.probe-outputs.json``, naming which verb wrote which entries, by their **exact names**: when
the process that claimed ends (or calls :func:`seal`), the entries that then match its patterns
are recorded one by one, so a later ``step_notes`` of the user's is never taken for the verb's.
While a claim is open (a run in progress, or one killed outright), its patterns stand for the
entries. An entry that is already there is removed only when the manifest says the same verb
wrote it; anything else (a file of the user's, another verb's store, a folder from before
manifests) stops the verb with a one-line error, and ``--force`` overrides it. The folder itself
is never removed, so ``--out .`` or ``--out ~`` is safe.

>>> import tempfile, os
>>> out = tempfile.mkdtemp()
>>> _ = claim(out, "dump", ["store", "step[0-9]*"])
>>> os.makedirs(os.path.join(out, "step0"))
>>> seal(out)                                        # the run ends: step0 is recorded
>>> os.makedirs(os.path.join(out, "step_notes"))     # the user's, made afterwards
>>> _ = claim(out, "dump", ["store", "step*"])
Traceback (most recent call last):
...
probe.ground.errors.ProbeError: ...step_notes was not written by probe (no record of it in the folder's manifest); choose another --out, or pass --force to replace it
>>> _ = claim(out, "dump", ["store", "step[0-9]*"])  # its own step0: replaced; step_notes stays
>>> os.path.exists(os.path.join(out, "step0")), os.path.exists(os.path.join(out, "step_notes"))
(False, True)
>>> os.makedirs(os.path.join(out, "store"))
>>> try:
...     claim(out, "train", ["store"])
... except ProbeError as e:
...     print(str(e).split(os.sep)[-1])
store was written by 'probe dump', not 'probe train'; choose another --out, or pass --force to replace it
"""

from __future__ import annotations

import atexit
import contextlib
import fnmatch
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterable, Iterator

from probe.ground.errors import ProbeError

MANIFEST = ".probe-outputs.json"

#: this process's open claims: folder -> the pid that claimed it (a forked child seals nothing)
_OPEN: dict[Path, int] = {}
#: names this process's claims in the manifests (``pending``), unique across hosts sharing a folder
_TOKEN = uuid.uuid4().hex


def _read(root: Path) -> dict:
    path = root / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"entries": {}}
    except (OSError, ValueError):
        raise ProbeError(f"{path}: unreadable output manifest; remove it (and what probe wrote "
                         "beside it) or choose another --out") from None
    if not isinstance(data, dict) or not isinstance(data.get("entries"), dict) \
            or not isinstance(data.get("pending", {}), dict):
        raise ProbeError(f"{path}: not a probe output manifest; choose another --out")
    return data


def _write(root: Path, data: dict) -> None:
    tmp = root / f"{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True), encoding="utf-8")
    os.replace(tmp, root / MANIFEST)


def _is_pattern(key: str) -> bool:
    return any(c in key for c in "*?[")


def _owner(data: dict, name: str) -> str | None:
    """Who wrote ``name``: its exact entry, else an open claim whose patterns match it, else a
    pattern of a manifest from before exact names were recorded."""
    entries: dict[str, str] = data["entries"]
    if name in entries and not _is_pattern(name):
        return entries[name]
    for claim_ in data.get("pending", {}).values():
        if any(fnmatch.fnmatchcase(name, p) for p in claim_.get("patterns", ())):
            return claim_.get("verb")
    for key, verb in entries.items():
        if _is_pattern(key) and fnmatch.fnmatchcase(name, key):
            return verb
    return None


def _skip(name: str) -> bool:
    return name == MANIFEST or name.startswith(MANIFEST + ".")


def claim(out: str | os.PathLike, verb: str, patterns: Iterable[str], *, force: bool = False) -> Path:
    """Make ``out`` ready for ``verb`` to write the top-level entries matching ``patterns``.

    Creates the folder if needed. Existing entries matching a pattern are removed when the
    manifest says ``verb`` wrote them (or with ``force``); any other match is a ProbeError that
    names it. The claim stays open until this process ends (or :func:`seal`), which records the
    exact names then matching ``patterns``. Returns the folder.
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
    pending: dict[str, dict] = data.setdefault("pending", {})
    if created:
        data["created_by"] = verb
    patterns = list(patterns)
    doomed: list[Path] = []
    for child in sorted(root.iterdir()):
        if _skip(child.name) or not any(fnmatch.fnmatchcase(child.name, p) for p in patterns):
            continue
        owner_ = _owner(data, child.name)
        if owner_ != verb and not force:
            who = f"was written by 'probe {owner_}', not 'probe {verb}'" if owner_ else \
                "was not written by probe (no record of it in the folder's manifest)"
            raise ProbeError(f"{child} {who}; choose another --out, or pass --force to replace it")
        doomed.append(child)
    for child in doomed:
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
        entries.pop(child.name, None)
    for key in [k for k, v in entries.items() if v == verb and _is_pattern(k)]:
        del entries[key]              # a pattern of an older manifest: its matches were just replaced
    mine = pending.setdefault(_TOKEN, {"verb": verb, "patterns": []})
    mine["patterns"] = sorted(set(mine["patterns"]) | set(patterns))
    _write(root, data)
    if root.resolve() not in _OPEN:
        _OPEN[root.resolve()] = os.getpid()
    return root


def discard_if_unused(out: str | os.PathLike) -> bool:
    """Remove ``out`` when it holds nothing but this module's manifest (a claim whose command
    then failed before writing anything: a bad input leaves no empty folder behind); whether
    it was removed.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp()) / "cmp"
    >>> _ = claim(d, "compare", ["summary.json"])
    >>> discard_if_unused(d), d.exists()
    (True, False)
    """
    root = Path(out)
    try:
        names = [c.name for c in root.iterdir()]
    except OSError:
        return False
    if any(not n.startswith(MANIFEST) for n in names):
        return False
    _OPEN.pop(root.resolve(), None)
    shutil.rmtree(root, ignore_errors=True)
    return not root.exists()


def seal(out: str | os.PathLike) -> None:
    """Record, by exact name, the entries of ``out`` that match this process's open claim there,
    and close the claim (done for every open claim when the process exits)."""
    root = Path(out).resolve()
    if _OPEN.pop(root, None) is None or not root.is_dir():
        return
    with _locked(root):
        data = _read(root)
        mine = data.get("pending", {}).pop(_TOKEN, None)
        if mine is None:
            return
        entries: dict[str, str] = data["entries"]
        for child in root.iterdir():
            name = child.name
            if _skip(name) or not any(fnmatch.fnmatchcase(name, p) for p in mine["patterns"]):
                continue
            if entries.get(name, mine["verb"]) == mine["verb"]:
                entries[name] = mine["verb"]
        _write(root, data)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """Exclusive POSIX lock on ``root/.probe-outputs.json.lock`` (the ranks of one launch seal
    one at a time; ``probe profile`` claims under the same lock)."""
    import fcntl

    with open(root / f"{MANIFEST}.lock", "a") as fh:
        fcntl.lockf(fh, fcntl.LOCK_EX)
        yield


@atexit.register
def _seal_all() -> None:
    for root, pid in list(_OPEN.items()):
        if pid != os.getpid():
            continue
        try:
            seal(root)
        except (OSError, ProbeError):    # the folder went away or became unreadable: nothing to record
            pass


def owner(out: str | os.PathLike, name: str) -> str | None:
    """The verb the manifest of ``out`` names as the writer of its top-level entry ``name``.

    None where no manifest names it (or ``out`` has none).
    """
    root = Path(out)
    return _owner(_read(root), name) if root.is_dir() else None


def created_by(out: str | os.PathLike) -> str | None:
    """The verb that created ``out`` (None: it existed before probe wrote into it)."""
    root = Path(out)
    return _read(root).get("created_by") if root.is_dir() else None
