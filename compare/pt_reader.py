"""Read a tensor that ``torch.save`` wrote (msprobe's PyTorch tensor files) without torch.

A ``.pt`` file is a zip: ``<name>/data.pkl`` pickles the tensor as a call of
``torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)`` whose storage is a
persistent reference to ``<name>/data/<key>``, the raw little-endian elements. The pickle is
read with an unpickler that knows only those names (the rebuild function, the storage types,
``collections.OrderedDict``) and refuses every other global, so a file cannot run code; the
tensor is rebuilt as a NumPy array (bfloat16 as the float32 values it holds).

>>> import io, zipfile
>>> read_pt(io.BytesIO(b"not a zip")) is None
True
"""

from __future__ import annotations

import collections
import math
import os
import pickle
import zipfile
from typing import IO, Any

import numpy as np

from probe.ground.files import check_regular, check_zip_members, max_tensor_bytes

__all__ = ["bfloat16_values", "read_pt"]

#: the storage types torch pickles, and their element dtype ("bfloat16": 2 bytes, widened)
_STORAGES = {
    "FloatStorage": "<f4", "DoubleStorage": "<f8", "HalfStorage": "<f2", "BFloat16Storage": "bfloat16",
    "LongStorage": "<i8", "IntStorage": "<i4", "ShortStorage": "<i2", "CharStorage": "i1",
    "ByteStorage": "u1", "BoolStorage": "?",
}
#: the largest tensor read (elements): a bigger storage is not compared element-wise
MAX_ELEMENTS = 1 << 31


def bfloat16_values(raw: bytes, count: int) -> np.ndarray:
    """``count`` little-endian bfloat16 numbers as float32 (NumPy has no bfloat16; a bfloat16 is
    the top half of the float32 of the same value).

    >>> bfloat16_values(bytes([0x80, 0x3f, 0xc0, 0xff]), 2).tolist()       # 1.0, NaN
    [1.0, nan]
    """
    return (np.frombuffer(raw, dtype="<u2", count=count).astype(np.uint32) << 16).view(np.float32)


class _Storage:
    def __init__(self, dtype: str) -> None:
        self.dtype = dtype


def _rebuild(storage: np.ndarray, offset: int, size: tuple, stride: tuple, *_: Any) -> np.ndarray:
    size, stride = tuple(int(s) for s in size), tuple(int(s) for s in stride)
    if any(s < 0 for s in size + stride) or offset < 0:
        raise ValueError("negative size, stride or offset")
    if math.prod(size) > MAX_ELEMENTS:
        raise ValueError("tensor too large")
    if size and all(size):
        last = offset + sum((n - 1) * st for n, st in zip(size, stride))
        if last >= storage.size:
            raise ValueError("the tensor reaches past its storage")
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], shape=size,
                                           strides=tuple(st * item for st in stride), writeable=False)
    return np.array(view)


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: IO[bytes], archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(file)
        self.archive, self.prefix = archive, prefix
        self.limit = max_tensor_bytes()

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return _rebuild
        if module == "torch" and name in _STORAGES:
            return _Storage(_STORAGES[name])
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        raise pickle.UnpicklingError(f"{module}.{name} is not a tensor's part")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _Storage)):
            raise pickle.UnpicklingError("not a tensor storage")
        kind, key, numel = pid[1].dtype, str(pid[2]), int(pid[4])
        width = 2 if kind == "bfloat16" else np.dtype(kind).itemsize
        if not 0 <= numel <= MAX_ELEMENTS or numel * width > self.limit:
            raise pickle.UnpicklingError("storage too large")
        name = f"{self.prefix}data/{key}"
        if self.archive.getinfo(name).file_size != numel * width:
            raise pickle.UnpicklingError("the storage's size is not its elements'")
        raw = self.archive.read(name)
        if kind == "bfloat16":
            return bfloat16_values(raw, numel)
        return np.frombuffer(raw, dtype=kind, count=numel)


def read_pt(file: str | IO[bytes]) -> np.ndarray | None:
    """The tensor of a ``torch.save`` file as a NumPy array, or None when the file is not one
    (another object, a legacy non-zip file, a pickle that names anything else, damage).
    A file that is no regular file, or whose members would expand beyond
    :func:`probe.ground.files.max_tensor_bytes` (a zip bomb), is refused before anything is
    decompressed: :class:`probe.ground.errors.ProbeError` naming it."""
    if isinstance(file, (str, os.PathLike)):
        check_regular(file)
    try:
        with zipfile.ZipFile(file) as archive:
            check_zip_members(file if isinstance(file, (str, os.PathLike)) else "<tensor file>", archive.infolist())
            pkl = [n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
            if len(pkl) != 1:
                return None
            prefix = pkl[0][: -len("data.pkl")]
            with archive.open(pkl[0]) as f:
                got = _Unpickler(f, archive, prefix).load()
    except (zipfile.BadZipFile, pickle.UnpicklingError, ValueError, KeyError, EOFError, OSError,
            TypeError, AttributeError, IndexError):
        return None
    return got if isinstance(got, np.ndarray) else None
