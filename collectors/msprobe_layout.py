"""msprobe's dump layout: where its files lie, how its entries are named, what a tensor holds.

The vocabulary that every msprobe reader shares (:mod:`probe.collectors.msprobe_reader`, the native
scanner :mod:`probe.collectors.msprobe_scan` and the flattening of entries
:mod:`probe.collectors.msprobe_flatten`):

- folders: one per step and process, ``step{N}/rank{R}/`` (or ``proc<pid>`` when no distributed
  group was initialised), holding ``dump.json``, ``construct.json`` and ``stack.json``;
- entry names: ``(Module|Cell).<path.Class>.(forward|backward|parameters_grad).<call>`` for
  modules (the first part is a registered framework's module prefix,
  :func:`probe.ground.frameworks.module_prefixes`), ``<Prefix>.<api>.<call>.(forward|backward)``
  for APIs (:func:`parse_node_name`);
- an entry's keys and the record slot each becomes (:data:`SLOTS`), and the fields of a tensor
  (:data:`STAT_TYPE`);
- the JSON itself, with the ``NaN``, ``Infinity`` and ``-Infinity`` literals msprobe writes
  (:func:`loads`).

>>> parse_node_name("Module.fc.Linear.forward.0")
('module', 'Module', 'fc.Linear', 'forward', 0)
>>> loads(b'{"Max": NaN}')
{'Max': nan}
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from probe.ground.errors import ProbeError
from probe.ground.frameworks import module_prefixes

try:
    import orjson as _orjson
except ImportError:  # the standard library parser is the fallback
    _orjson = None

__all__ = ["STAT_TYPE", "SLOTS", "DuplicateKey", "loads", "loads_unique", "position_names", "parse_node_name",
           "step_rank", "find_dump_files", "ranked_dump_files", "find_dump"]

#: The fields of one tensor of an entry, as msprobe writes them, and the ``tensor_id`` our dumps
#: add (the data's id in the step; msprobe's tools ignore it, and its own dumps have none).
STAT_TYPE = pa.struct([
    ("type", pa.string()), ("dtype", pa.string()), ("shape", pa.list_(pa.int64())),
    ("Max", pa.float64()), ("Min", pa.float64()), ("Mean", pa.float64()), ("Norm", pa.float64()),
    ("md5", pa.string()), ("data_name", pa.string()), ("requires_grad", pa.bool_()),
    ("tensor_id", pa.int64()),
])

#: An entry's keys, in the order an entry holds them, and the slot of the tensor records each
#: becomes (``input`` is a backward entry's: the incoming gradients); a ``parameters_grad``
#: entry's tensors are ``parameter_grad``.
SLOTS: dict[str, str] = {"input_args": "input", "input_kwargs": "kwarg", "output": "output",
                         "parameters": "parameter", "input": "input"}

_STEP_RE = re.compile(r"^step(\d+)$")
_RANK_RE = re.compile(r"^(?:rank|proc)(\d+)$")
#: ``proc<pid>``: msprobe's folder of a process outside any distributed group
_PROC_RE = re.compile(r"^proc(\d+)$")


_HIGH = rb"\\u[dD][89abAB][0-9a-fA-F]{2}"
_LOW = rb"\\u[dD][c-fC-F][0-9a-fA-F]{2}"
#: a ``\u`` escape of half a surrogate pair without its other half (not a character)
_LONE_SURROGATE = re.compile(_HIGH + b"(?!" + _LOW + b")|(?<!" + _HIGH + b")" + _LOW)


def loads(text: bytes) -> Any:
    r"""Parse JSON; orjson when available, the standard library when orjson refuses the text
    (it rejects the NaN/Infinity literals that the standard library reads as msprobe writes them).
    A ``\u`` escape of half a surrogate pair, which the standard library lets through as a
    string that no file or Arrow column can hold, is a :class:`json.JSONDecodeError` as in orjson.

    >>> loads(b'[1, -Infinity]')
    [1, -inf]
    >>> loads(b'[NaN, "\\ud800"]')
    Traceback (most recent call last):
    json.decoder.JSONDecodeError: a \u escape of half a surrogate pair, not a character: line 1 column 8 (char 7)
    """
    if _orjson is not None:
        try:
            return _orjson.loads(text)
        except _orjson.JSONDecodeError:
            pass
    doc = json.loads(text)
    wide = b"\0" in text[:4]                        # UTF-16/32 text: its escapes not searched
    if wide or (b"\\" in text and b"\\u" in text):     # one byte is found 100x faster
        lone = None if wide else _LONE_SURROGATE.search(text)
        if (wide or lone is not None) and _holds_surrogate(doc):
            raise json.JSONDecodeError(r"a \u escape of half a surrogate pair, not a character",
                                       text.decode("utf-8", "replace") if lone else "",
                                       lone.start() if lone else 0)
    return doc


class DuplicateKey(ValueError):
    """A JSON object that names one key twice (a JSON reader would keep the last silently)."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key[:200]!r} appears twice in one object")
        self.key = key


def loads_unique(text: bytes) -> Any:
    r""":func:`loads`, refusing a document in which one object names a key twice
    (:class:`DuplicateKey`, naming the key) instead of keeping the last value silently.

    orjson keeps no record of a repeated key, and the standard library's ``object_pairs_hook``
    would more than double the parse (an 86 MB dump.json: 0.5 s -> 2 s). So the parsed document
    is written back (orjson, 0.1-0.15 s there) and its colons counted against the text's: every
    member of the text has one outside its strings, and a member dropped as a repeat takes its
    colon (and those of its value) with it. Only when they differ, or when the text is one that
    count cannot read (a ``:`` escape of a colon, UTF-16/32 text, a value orjson cannot
    write), is it parsed again with the hook, which names the key.

    >>> loads_unique(b'{"a": {"x:y": 1}, "b": 2}')
    {'a': {'x:y': 1}, 'b': 2}
    >>> loads_unique(b'{"data": {"Torch.add.0.forward": {}, "Torch.add.0.forward": {}}}')
    Traceback (most recent call last):
    probe.collectors.msprobe_layout.DuplicateKey: the key 'Torch.add.0.forward' appears twice in one object
    """
    doc = loads(text)
    if not isinstance(doc, (dict, list)):
        return doc
    # (a one-byte search is a memchr: 10 ms on 86 MB, where the escape's own search takes 60)
    if _orjson is not None and b"\0" not in text[:4] and (b"\\" not in text or b"\\u003" not in text):
        try:
            again = _orjson.dumps(doc)
        except (TypeError, _orjson.JSONEncodeError):  # an integer beyond 64 bits, deep nesting
            again = None
        if again is not None and again.count(b":") == text.count(b":"):
            return doc
    _find_duplicate(text)
    return doc


def _find_duplicate(text: bytes) -> None:
    """Parse ``text`` (read already) again, raising :class:`DuplicateKey` at its first repeated key."""
    def unique(pairs: list) -> dict:
        d = dict(pairs)
        if len(d) != len(pairs):
            seen: set = set()
            for k, _ in pairs:
                if k in seen:
                    raise DuplicateKey(k)
                seen.add(k)
        return d
    try:
        json.loads(text, object_pairs_hook=unique)
    except DuplicateKey:
        raise
    except (ValueError, RecursionError):      # read by loads() already: nothing repeated found
        pass


def _holds_surrogate(doc: Any) -> bool:
    """Whether a string of ``doc`` holds a lone surrogate (cannot be written as UTF-8)."""
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def position_names(n: int) -> pa.Array:
    """``["0", "1", ..., str(n - 1)]`` as an Arrow array (a list's positions are taken from it).

    >>> position_names(3).to_pylist()
    ['0', '1', '2']
    """
    return pa.array([str(i) for i in range(n)], type=pa.string())


def parse_node_name(name: str) -> tuple[str, str, str, str, int]:
    """Split an msprobe dump name into (kind, prefix, body, direction, call index).

    ``kind`` is ``module``, ``api`` or ``comm``; ``direction`` is ``forward``, ``backward``
    or ``parameters_grad``; ``body`` is ``path.Class`` for modules and the API name otherwise.

    >>> parse_node_name("Module.layers.0.attn.q_proj.Linear.forward.0")
    ('module', 'Module', 'layers.0.attn.q_proj.Linear', 'forward', 0)
    >>> parse_node_name("Primitive.matmul.MatMul.3.backward")
    ('api', 'Primitive', 'matmul.MatMul', 'backward', 3)
    >>> parse_node_name("Cell.head.Dense.parameters_grad.0")
    ('module', 'Cell', 'head.Dense', 'parameters_grad', 0)
    """
    parts = name.split(".")
    prefix = parts[0]
    if prefix in module_prefixes() and len(parts) >= 4 and parts[-1].isdigit():
        return "module", prefix, ".".join(parts[1:-2]), parts[-2], int(parts[-1])
    if len(parts) >= 4 and parts[-2].isdigit():
        kind = "comm" if prefix == "Distributed" else "api"
        return kind, prefix, ".".join(parts[1:-2]), parts[-1], int(parts[-2])
    if len(parts) >= 4 and parts[-1].isdigit():
        return "module", prefix, ".".join(parts[1:-2]), parts[-2], int(parts[-1])
    return "api", prefix, ".".join(parts[1:]), "forward", 0


def step_rank(path: Path) -> tuple[int | None, int | None]:
    """The step and rank named by ``path``'s ``step{N}`` and ``rank{R}``/``proc{R}`` folders.

    >>> step_rank(Path("OUT/step2/rank1/dump.json"))
    (2, 1)
    """
    step = rank = None
    for part in path.parts:
        m = _STEP_RE.match(part)
        if m:
            step = int(m.group(1))
        m = _RANK_RE.match(part)
        if m:
            rank = int(m.group(1))
    return step, rank


def find_dump_files(root: str | os.PathLike) -> list[Path]:
    """Every ``dump.json`` under ``root`` (or ``root`` itself), sorted by step then rank.

    >>> find_dump_files("OUT")                 # doctest: +SKIP
    [PosixPath('OUT/step0/rank0/dump.json'), PosixPath('OUT/step0/rank1/dump.json')]
    """
    root = Path(root)
    if root.is_file():
        return [root]
    found = [Path(dp) / "dump.json" for dp, _, files in os.walk(root) if "dump.json" in files]

    def key(p: Path) -> tuple:
        step, rank = step_rank(p)
        return (step if step is not None else -1, rank if rank is not None else -1, str(p))
    return sorted(found, key=key)


def ranked_dump_files(root: str | os.PathLike) -> dict[tuple[int | None, int | None], Path]:
    """Every ``dump.json`` under ``root`` keyed by its (step, rank), in that order.

    The layouts msprobe writes: ``step{N}/rank{R}/`` (a distributed group), ``step{N}/proc{PID}/``
    (none: msprobe 26.2 names the folder after the process id, and dump.json records no rank:
    its members are task, level, framework, dump_data_dir and data), a plain ``rank{R}/`` or
    ``proc{PID}/`` (no step folder: step None), and a dump.json by itself ((None, None)). A
    ``proc{PID}`` folder is given a rank as msprobe's own tools (``dump2db``) give it one: the
    run's processes in PID order, numbered after its highest ``rank{R}`` (from 0 when it has
    none), each process the same number in every step, so that two runs' processes, whose PIDs
    differ, pair up rank by rank.

    >>> import tempfile
    >>> d = Path(tempfile.mkdtemp())
    >>> for f in ("step0/proc912", "step0/proc77", "step1/proc912", "step1/proc77"):
    ...     (d / f).mkdir(parents=True); _ = (d / f / "dump.json").write_text("{}")
    >>> {k: str(v.relative_to(d).parent) for k, v in ranked_dump_files(d).items()}
    {(0, 0): 'step0/proc77', (0, 1): 'step0/proc912', (1, 0): 'step1/proc77', (1, 1): 'step1/proc912'}
    """
    root = Path(root)
    found = []                                  # (file, step, rank, pid), rank None for a proc
    for f in find_dump_files(root):
        rel = f.relative_to(root) if f != root else Path(f.name)
        step, rank = step_rank(rel)
        pid = next((int(m.group(1)) for m in map(_PROC_RE.match, rel.parts) if m), None)
        found.append((f, step, None if pid is not None else rank, pid))
    top = max((r for _, _, r, _ in found if r is not None), default=-1)
    number = {pid: top + 1 + i for i, pid in enumerate(sorted({p for *_, p in found if p is not None}))}
    keyed: dict[tuple[int | None, int | None], Path] = {}
    for f, step, rank, pid in found:
        keyed.setdefault((step, number[pid] if pid is not None else rank), f)

    def order(k: tuple) -> tuple:
        return tuple(-1 if v is None else v for v in k)
    return dict(sorted(keyed.items(), key=lambda kv: order(kv[0])))


def find_dump(path: str | os.PathLike, step: int | None = None, rank: int | None = None) -> Path:
    """The ``dump.json`` named by ``path``: the file itself, or the one of ``step`` and ``rank``
    under a folder (a rank, step or dump root; the lowest step, then rank, when not given).

    >>> find_dump("OUT", step=2, rank=1)                 # doctest: +SKIP
    PosixPath('OUT/step2/rank1/dump.json')
    """
    p = Path(path)
    if not p.exists():
        raise ProbeError(f"{p}: no such dump; give a dump.json file or a dump folder")
    files = find_dump_files(p)
    if not files:
        raise ProbeError(f"{p}: no dump.json found (expected step<N>/rank<R>/dump.json under it)")
    picked = [f for f in files if step in (None, step_rank(f)[0]) and rank in (None, step_rank(f)[1])]
    if not picked:
        found = ", ".join(str(f.relative_to(p).parent) for f in files[:8])
        raise ProbeError(f"{p}: no dump of step {step} rank {rank} (found {found})")
    return picked[0]
