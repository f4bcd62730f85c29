"""Write msprobe's exact dump files: ``dump.json``, ``construct.json`` and ``stack.json``.

One call per step and rank writes ``OUT/step{N}/rank{R}/`` as mindstudio-probe does, so
msprobe's own compare and graph tools read our dumps:

- ``dump.json``: ``{"task", "level", "framework", "dump_data_dir", "data": {name: entry}}``;
  a forward entry holds ``input_args`` (list), ``input_kwargs`` (dict), ``output`` (list) and,
  for modules, ``parameters`` (dict); a backward entry holds ``input`` (gradients of the
  outputs) and ``output`` (gradients of the inputs); a ``parameters_grad`` entry maps each
  parameter name to a one-item list. A tensor is ``{"type", "dtype", "shape", "Max", "Min",
  "Mean", "Norm", "requires_grad"}`` (plus ``md5`` or ``data_name`` by task, and the
  ``tensor_id`` ``probe dump`` adds, which msprobe's tools ignore).
- ``construct.json``: ``{name: parent name or null}``.
- ``stack.json``: ``{"0": [[names sharing a stack], [frame lines]], ...}``.

Files are written to a temporary name and renamed, so a reader never sees half a file.

>>> import tempfile, json, os
>>> d = write_step(tempfile.mkdtemp(), step=0, rank=0, data={"Module.fc.Linear.forward.0": {}},
...                construct={"Module.fc.Linear.forward.0": None}, stacks={},
...                task="statistics", level="L0", framework="pytorch")
>>> sorted(os.listdir(d))
['construct.json', 'dump.json', 'stack.json']
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping

import orjson

from probe.ground.errors import ProbeError
from probe.ground.files import disk_full, is_disk_full

#: msprobe's name for each of our levels.
LEVELS = {"module": "L0", "api": "L1", "mix": "mix"}

_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-]")


_made: set[str] = set()


def step_dir(out: str | os.PathLike, step: int, rank: int) -> Path:
    """``OUT/step{N}/rank{R}`` (created; a folder made once is not made again every write)."""
    d = os.path.join(os.fspath(out), f"step{int(step)}", f"rank{int(rank)}")
    if d not in _made or not os.path.isdir(d):
        for attempt in range(3):
            try:
                # os.makedirs looks before it makes: a new step's folder costs a sixth of
                # Path.mkdir(parents=True), which first fails on the missing parent
                os.makedirs(d, exist_ok=True)
                break
            except FileNotFoundError as e:
                # another rank removed the step's folder, left empty, between makedirs making
                # it and making ours in it (a step it could not write whole): make both again
                if attempt == 2:
                    raise ProbeError(f"{d}: cannot create the dump directory ({e.strerror})") from None
            except OSError as e:
                raise ProbeError(f"{d}: cannot create the dump directory ({e.strerror})") from None
        _made.add(d)
    return Path(d)


def safe_file_name(name: str, suffix: str = "") -> str:
    """A file name made from a dump name that cannot leave its folder.

    Path separators, ``..`` and any character outside ``[A-Za-z0-9_.-]`` become ``_``.

    >>> safe_file_name("Module.../../etc/passwd.Linear.forward.0", ".safetensors")
    'Module._._.__etc_passwd.Linear.forward.0.safetensors'
    """
    cleaned = _UNSAFE.sub("_", name)
    while ".." in cleaned:
        cleaned = cleaned.replace("..", "._")
    cleaned = cleaned.lstrip(".") or "_"
    return cleaned[:200] + suffix


def contained_path(folder: str | os.PathLike, name: str, suffix: str = "") -> Path:
    """``folder/safe_file_name(name)``; raises if the result would fall outside ``folder``."""
    folder = Path(folder).resolve()
    path = (folder / safe_file_name(name, suffix)).resolve()
    if path.parent != folder:
        raise ProbeError(f"{name!r}: this dump name would write outside {folder}")
    return path


_last_text: dict[tuple[str, int | None], tuple[Any, str]] = {}


#: msprobe writes non-finite floats as the literals NaN, Infinity and -Infinity (not strict
#: JSON); orjson would write them as null, so they go in as pre-encoded fragments.
NAN, POS_INF, NEG_INF = orjson.Fragment(b"NaN"), orjson.Fragment(b"Infinity"), orjson.Fragment(b"-Infinity")
_FRAGMENT_FLOATS = {id(NAN): math.nan, id(POS_INF): math.inf, id(NEG_INF): -math.inf}


def json_float(v: float) -> Any:
    """``v`` as it goes into a dump entry: itself, or msprobe's literal when it is NaN or Inf.

    >>> json_float(1.5), orjson.dumps([json_float(float("nan")), json_float(-float("inf"))])
    (1.5, b'[NaN,-Infinity]')
    """
    if math.isfinite(v):
        return v
    return NAN if v != v else (POS_INF if v > 0 else NEG_INF)


def _fragment_float(o: Any) -> float:
    try:
        return _FRAGMENT_FLOATS[id(o)]
    except KeyError:
        raise TypeError(f"{type(o).__name__} is not JSON serializable") from None


def _encode(obj: Any, indent: int | None, fast: bool) -> bytes:
    """JSON bytes of ``obj``: with ``fast`` (no raw non-finite float in ``obj``, see
    :func:`json_float`) orjson, else the standard encoder; non-finite floats become literals."""
    if indent is None and fast:
        try:
            return orjson.dumps(obj)
        except TypeError:
            pass
    return json.dumps(obj, indent=indent, ensure_ascii=False, default=_fragment_float).encode("utf-8")


def _encoded(name: str, obj: Any, indent: int | None, fast: bool) -> bytes:
    key = (name, indent)
    last = _last_text.get(key)
    if last is not None and last[0] == obj:      # construct/stack rarely change between steps
        return last[1]
    text = _encode(obj, indent, fast)
    if name != "dump.json":
        _last_text[key] = (obj, text)
    return text


def encode_step(*, data: Mapping[str, Any], construct: Mapping[str, str | None],
                stacks: Mapping[str, list], task: str, level: str, framework: str,
                dump_data_dir: str | None = None, indent: int | None = None, finite: bool = False,
                grouped_stacks: Mapping[str, list] | None = None) -> list[tuple[str, bytes]]:
    """The three msprobe files of one step as ``(file name, bytes)``, in the order
    :func:`write_files` writes them (see :func:`write_step` for the arguments)."""
    header = {
        "task": task,
        "level": LEVELS.get(level, level),
        "framework": framework,
        "dump_data_dir": dump_data_dir,
        "data": data,
    }
    return [
        ("dump.json", _encoded("dump.json", header, indent, finite)),
        ("construct.json", _encoded("construct.json", dict(construct), indent, True)),
        ("stack.json", _encoded("stack.json", group_stacks(stacks) if grouped_stacks is None
                                else grouped_stacks, indent, True)),
    ]


def write_files(folder: Path, files: Iterable[tuple[str, bytes]]) -> None:
    """Write each ``(file name, bytes)`` into ``folder`` whole (a temporary file renamed over
    the name: a reader never sees half a file)."""
    for name, text in files:
        path = folder / name
        tmp = path.with_name("." + name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(text)
            os.replace(tmp, path)
        except OSError as e:         # no temporary file left behind; a full disk is one line
            tmp.unlink(missing_ok=True)
            if is_disk_full(e):
                raise disk_full(folder, e) from None
            raise


def write_step(out: str | os.PathLike, *, step: int, rank: int, data: Mapping[str, Any],
               construct: Mapping[str, str | None], stacks: Mapping[str, list],
               task: str, level: str, framework: str, dump_data_dir: str | None = None,
               indent: int | None = None, finite: bool = False,
               grouped_stacks: Mapping[str, list] | None = None) -> Path:
    """Write the three msprobe files of one step and rank; returns their folder.

    ``level`` is ours (``module``/``api``/``mix``) or msprobe's (``L0``/``L1``/``mix``);
    ``framework`` is ``pytorch`` or ``mindspore``. ``stacks`` maps a name to its list of
    frame lines; names with the same frames are grouped as msprobe groups them. ``indent=None``
    (the default) writes compact JSON with the C encoder; readers see the same document.
    Non-finite floats in ``data`` are written as ``NaN``/``Infinity``/``-Infinity``.
    ``finite=True`` promises that every float in ``data`` is finite or already a
    :func:`json_float` fragment, which allows the faster encoder. ``grouped_stacks``:
    :func:`group_stacks` of ``stacks``, when the caller has it already.
    """
    folder = step_dir(out, step, rank)
    write_files(folder, encode_step(data=data, construct=construct, stacks=stacks, task=task,
                                    level=level, framework=framework, dump_data_dir=dump_data_dir,
                                    indent=indent, finite=finite, grouped_stacks=grouped_stacks))
    return folder


def group_stacks(stacks: Mapping[str, list]) -> dict[str, list]:
    """msprobe's stack.json layout: names that share the same frames are listed together.

    >>> group_stacks({"a": ["f1"], "b": ["f1"], "c": ["f2"]})
    {'0': [['a', 'b'], ['f1']], '1': [['c'], ['f2']]}
    """
    groups: dict[tuple, list[str]] = {}
    for name, frames in stacks.items():
        groups.setdefault(tuple(frames), []).append(name)
    return {str(i): [names, list(frames)] for i, (frames, names) in enumerate(groups.items())}
