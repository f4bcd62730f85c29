"""The recorded API calls of a tensor dump, in execution order, ready to replay.

A dump made with ``probe dump --task tensor --level api`` (or ``mix``; msprobe's L1 and mix
dumps too) holds, per step and rank, ``dump.json`` (each call's inputs, keyword arguments and
outputs; a tensor names its file in ``data_name``), ``construct.json`` (the calls in the order
they started) and the tensor files under ``dump_tensor_data`` (safetensors; msprobe's ``.pt``
files are read with ``weights_only``). :func:`find_steps` lists the step/rank folders of a dump
directory; :func:`read_calls` reads one into :class:`Call` objects whose tensors are
:class:`TensorRef` until :func:`materialise` loads them.

>>> decode({"type": "torch.dtype", "value": "torch.bfloat16"})
torch.bfloat16
>>> decode([{"type": "int", "value": 2}, {"type": "slice", "value": [None, 4, None]}])
[2, slice(None, 4, None)]
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import torch

from probe.checker.apis import split_name
from probe.ground.errors import ProbeError
from probe.ground.files import TENSOR_LIMIT_VARIABLE, check_tensor_file, max_tensor_bytes, read_regular, safetensors_entries
from probe.ground.frameworks import module_prefixes

#: at most this many bytes of dump.json are read (a larger one is not a dump of API calls)
MAX_JSON_BYTES = 1 << 30


@dataclass(frozen=True)
class TensorRef:
    """A recorded tensor: its file (None when the dump holds statistics only), dtype and shape."""

    file: str | None
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Call:
    """One recorded forward call of an API."""

    name: str                   # Functional.linear.3.forward
    api: str                    # Functional.linear
    index: int                  # 3
    order: int                  # its place among the step's calls, as they started
    step: int
    rank: int
    args: list
    kwargs: dict
    outputs: list               # TensorRef | scalar | None per recorded output
    parent: str | None = None   # the module call it ran in
    extra: dict = field(default_factory=dict)


def find_steps(root: str | os.PathLike) -> list[tuple[int, int, Path]]:
    """``(step, rank, folder)`` of every ``step{N}/rank{R}/dump.json`` under ``root`` (or
    ``root`` itself when it is such a folder, or a dump.json file)."""
    p = Path(root)
    if not p.exists():
        raise ProbeError(f"{root}: no such dump directory")
    if p.is_file():
        if p.name != "dump.json":
            raise ProbeError(f"{root}: give a dump directory or its dump.json")
        p = p.parent
    if (p / "dump.json").is_file():
        return [(_number(p.parent.name, "step"), _number(p.name, "rank"), p)]
    found = []
    for d in sorted(p.glob("step*/rank*/dump.json")):
        found.append((_number(d.parent.parent.name, "step"), _number(d.parent.name, "rank"), d.parent))
    if not found:
        raise ProbeError(f"{root}: no step*/rank*/dump.json here; give a dump made with "
                         "probe dump --task tensor --level api (or mix)")
    return sorted(found)


def _number(text: str, prefix: str) -> int:
    digits = text[len(prefix):] if text.startswith(prefix) else ""
    digits = digits.lstrip("_")
    return int(digits) if digits.isdigit() else 0


def read_calls(folder: Path, step: int = 0, rank: int = 0) -> tuple[list[Call], dict]:
    """The API forward calls of one ``step{N}/rank{R}`` folder in execution order, and the
    dump's header (``task``, ``level``, ``framework``, ``dump_data_dir``)."""
    import orjson

    dump = _load(folder / "dump.json")
    data = dump.get("data") if isinstance(dump, dict) else None
    if not isinstance(data, dict):
        raise ProbeError(f"{folder / 'dump.json'}: no 'data' object; not a dump.json of probe or msprobe")
    construct = {}
    cpath = folder / "construct.json"
    if cpath.is_file():
        try:
            loaded = orjson.loads(read_regular(cpath, MAX_JSON_BYTES))
            construct = loaded if isinstance(loaded, dict) else {}
        except (orjson.JSONDecodeError, OSError, ProbeError):
            construct = {}
    order = {name: i for i, name in enumerate(construct)}
    base = len(order)
    calls = []
    modules = tuple(p + "." for p in module_prefixes())      # module entries: not API calls
    for i, (name, entry) in enumerate(data.items()):
        if not isinstance(name, str) or not name.endswith(".forward") or not isinstance(entry, dict):
            continue
        if name.startswith(modules):
            continue
        api, index = split_name(name)
        if index < 0:
            continue
        args = entry.get("input_args", [])
        kwargs = entry.get("input_kwargs", {})
        outputs = entry.get("output", [])
        args = decode(args) if isinstance(args, list) else []
        kwargs = decode(kwargs) if isinstance(kwargs, dict) else {}
        calls.append(Call(name, api, index, order.get(name, base + i), step, rank, args,
                          kwargs if isinstance(kwargs, dict) else {},
                          decode(outputs if isinstance(outputs, list) else [outputs]),
                          parent=construct.get(name) if isinstance(construct.get(name), str) else None))
    calls.sort(key=lambda c: c.order)
    header = {k: dump.get(k) for k in ("task", "level", "framework", "dump_data_dir")}
    return calls, header


def _load(path: Path) -> Any:
    import orjson

    from probe.collectors.msprobe_layout import DuplicateKey, loads_unique

    try:
        return loads_unique(read_regular(path, MAX_JSON_BYTES))
    except OSError as e:
        raise ProbeError(f"{path}: cannot read ({e.strerror})") from None
    except DuplicateKey as e:      # a call named twice: never replayed as whichever came last
        raise ProbeError(f"{path}: {e} (a JSON reader would keep only the last); not a dump.json "
                         "msprobe or probe wrote: re-run the dump or give another file") from None
    except (orjson.JSONDecodeError, ValueError, UnicodeDecodeError, RecursionError) as e:
        return _load_lenient(path, e)


def _load_lenient(path: Path, error: Exception) -> Any:
    """msprobe writes NaN/Infinity literals, which orjson refuses; the json module reads them."""
    import json

    try:
        return json.loads(read_regular(path, MAX_JSON_BYTES).decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ProbeError(f"{path}: not valid JSON ({str(error).splitlines()[0]}); re-run the dump") from None


_SCALARS = {"int", "float", "bool", "str"}


def decode(x: Any) -> Any:
    """A dump entry (or a container of them) as the value it records; tensors as :class:`TensorRef`."""
    if isinstance(x, list):
        return [decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    kind = x.get("type")
    if kind is None:
        return {k: decode(v) for k, v in x.items()}
    value = x.get("value")
    if kind in ("torch.Tensor", "mindspore.Tensor", "numpy.ndarray") or "dtype" in x and "shape" in x:
        shape = x.get("shape") or []
        return TensorRef(x.get("data_name") if isinstance(x.get("data_name"), str) else None,
                         str(x.get("dtype", "")), tuple(int(s) for s in shape if isinstance(s, int)))
    if kind in _SCALARS:
        if kind == "float" and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                return value
        return value
    if kind == "torch.dtype" and isinstance(value, str):
        dt = getattr(torch, value.replace("torch.", ""), None)
        return dt if isinstance(dt, torch.dtype) else value
    if kind == "torch.device" and isinstance(value, str):
        return torch.device(value) if _valid_device(value) else value
    if kind == "torch.Size":
        return torch.Size(int(v) for v in value) if isinstance(value, list) else value
    if kind == "slice" and isinstance(value, list) and len(value) == 3:
        return slice(*value)
    if kind == "ellipsis":
        return Ellipsis
    return value


def _valid_device(text: str) -> bool:
    try:
        torch.device(text)
        return True
    except (RuntimeError, TypeError):
        return False


def tensor_refs(x: Any) -> Iterator[TensorRef]:
    """Every :class:`TensorRef` inside ``x``."""
    if isinstance(x, TensorRef):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from tensor_refs(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from tensor_refs(v)


class TensorFiles:
    """Loads the tensor files of one step/rank folder (``dump_tensor_data`` or where the dump's
    header says), every file at most once."""

    def __init__(self, folder: Path, header: dict) -> None:
        self.dirs = [folder / "dump_tensor_data"]
        given = header.get("dump_data_dir")
        if isinstance(given, str) and given:
            self.dirs.append(Path(given))

    def path(self, name: str) -> Path | None:
        if os.sep in name or "/" in name or name.startswith("."):
            return None
        for d in self.dirs:
            p = d / name
            if p.is_file():
                return p
        for d in self.dirs:          # a FIFO, a device, a link: refused by name when loaded
            p = d / name
            if p.is_symlink() or p.exists():
                return p
        return None

    def load(self, ref: TensorRef) -> torch.Tensor | None:
        """The tensor of ``ref``, or None when the dump holds no file for it."""
        if ref.file is None:
            return None
        p = self.path(ref.file)
        if p is None:
            return None
        _check_before_load(p, ref)
        try:
            if p.suffix == ".safetensors":
                from safetensors.torch import load_file
                tensors = load_file(str(p))
                t = next(iter(tensors.values())) if tensors else None
            else:
                t = torch.load(str(p), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - safetensors and torch raise several kinds
            raise ProbeError(f"{p}: not a readable tensor file ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
        if isinstance(t, torch.Tensor) and ref.shape and tuple(t.shape) != ref.shape:
            raise ProbeError(f"{p}: holds a tensor of shape {list(t.shape)}; dump.json says {list(ref.shape)}")
        return t


def _check_before_load(p: Path, ref: TensorRef) -> None:
    """Refuse (:class:`ProbeError` naming the file) a tensor file before reading it: no regular
    file, more bytes than :func:`probe.ground.files.max_tensor_bytes` (its zip members, its
    safetensors header, or the dump.json's own shape and dtype say), a safetensors header whose
    shape is not the dump.json's."""
    limit = max_tensor_bytes()
    dtype = getattr(torch, ref.dtype.replace("torch.", ""), None) if ref.dtype else None
    if isinstance(dtype, torch.dtype) and ref.shape and math.prod(ref.shape) * dtype.itemsize > limit:
        raise ProbeError(f"{p}: dump.json gives it shape {list(ref.shape)[:8]} ({ref.dtype}), more than the "
                         f"{limit} bytes one tensor may take (${TENSOR_LIMIT_VARIABLE} raises it); tensor skipped")
    check_tensor_file(p, limit)
    if p.suffix == ".safetensors" and ref.shape:
        shapes = [tuple(shape) for _, shape in safetensors_entries(p, limit).values()]
        if len(shapes) == 1 and shapes[0] != ref.shape:
            raise ProbeError(f"{p}: its header gives shape {list(shapes[0])[:8]}; dump.json says {list(ref.shape)[:8]}")


def materialise(x: Any, files: TensorFiles) -> tuple[Any, str | None]:
    """``x`` with every :class:`TensorRef` loaded; the second value names a missing file."""
    missing: list[str] = []

    def load(v: Any) -> Any:
        if isinstance(v, TensorRef):
            t = files.load(v)
            if t is None:
                missing.append(v.file or "")
            return t
        if isinstance(v, list):
            return [load(i) for i in v]
        if isinstance(v, tuple):
            return tuple(load(i) for i in v)
        if isinstance(v, dict):
            return {k: load(i) for k, i in v.items()}
        return v
    out = load(x)
    return out, (missing[0] if missing else None)
