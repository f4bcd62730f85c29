"""One tensor written as a safetensors file, byte for byte what ``safetensors.torch.save_file``
writes for ``{"tensor": t}``, without its per-call Python work.

The dump's tensor task writes every hooked tensor of a step to its own file on the training
thread (the data must be read before the step changes it). ``save_file`` spends most of a
small tensor's time in Python (shared-storage checks, flattening, pointer casts); here the
header is formatted from a table and the bytes go out through ``os.write`` (which lets go of
the GIL) straight from the tensor's memory. A dtype outside the table returns False and the
caller uses ``save_file``.

The file is opened with ``O_NOFOLLOW``: a symbolic link planted under the dump's name is
refused instead of followed out of the dump folder.

>>> import os, tempfile, torch
>>> from safetensors.torch import load_file
>>> p = os.path.join(tempfile.mkdtemp(), "t.safetensors")
>>> write_tensor(torch.arange(6.0).reshape(2, 3), p)
True
>>> load_file(p)["tensor"].tolist()
[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from __future__ import annotations

import os
from typing import Any

import torch

#: torch dtype -> the safetensors name, and the dtype whose NumPy view carries its bytes
_DTYPES: dict[torch.dtype, tuple[str, torch.dtype]] = {
    torch.float64: ("F64", torch.float64), torch.float32: ("F32", torch.float32),
    torch.float16: ("F16", torch.float16), torch.bfloat16: ("BF16", torch.int16),
    torch.int64: ("I64", torch.int64), torch.int32: ("I32", torch.int32),
    torch.int16: ("I16", torch.int16), torch.int8: ("I8", torch.int8),
    torch.uint8: ("U8", torch.uint8), torch.bool: ("BOOL", torch.bool),
}
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


_NUMPY = {torch.float64: "float64", torch.float32: "float32", torch.float16: "float16",
          torch.int64: "int64", torch.int32: "int32", torch.int16: "int16", torch.int8: "int8",
          torch.uint8: "uint8", torch.bool: "bool"}


def host_array(x: torch.Tensor) -> Any:
    """A zero-copy NumPy view of ``x``, a contiguous CPU tensor of a NumPy dtype, valid while
    ``x`` lives. Not ``x.numpy()``: that marks ``x``'s storage as not resizable for as long as
    it lives, and FSDP and ZeRO-3, which free a sharded parameter's storage with ``resize_(0)``
    after the dump read it, then fail ("Trying to resize storage that is not resizable").

    >>> t = torch.arange(4.0)
    >>> host_array(t).tolist(), t.untyped_storage().resizable()
    ([0.0, 1.0, 2.0, 3.0], True)
    """
    import ctypes

    import numpy as np

    dtype = np.dtype(_NUMPY[x.dtype])
    n = x.numel()
    if n == 0:
        return np.empty(0, dtype=dtype)
    buffer = (ctypes.c_char * (n * dtype.itemsize)).from_address(x.data_ptr())
    return np.frombuffer(buffer, dtype=dtype)


def writable(t: torch.Tensor) -> bool:
    """Whether :func:`write_tensor` writes ``t`` (its dtype and layout)."""
    return t.dtype in _DTYPES and t.layout is torch.strided


def write_tensor(t: torch.Tensor, path: str) -> bool:
    """Write ``t`` to ``path`` as ``save_file({"tensor": t}, path)`` does; False (nothing
    written) for a dtype or layout this does not handle."""
    spec = _DTYPES.get(t.dtype)
    if spec is None or t.layout is not torch.strided:
        return False
    name, view_as = spec
    x = t.detach()
    if not x.is_cpu:
        x = x.cpu()
    if not x.is_contiguous():
        x = x.contiguous()
    nbytes = x.numel() * x.element_size()
    shape = ",".join(str(int(d)) for d in x.shape)
    header = f'{{"tensor":{{"dtype":"{name}","shape":[{shape}],"data_offsets":[0,{nbytes}]}}}}'.encode()
    header += b" " * (-len(header) % 8)
    fd = os.open(path, _FLAGS, 0o644)
    try:
        _write_all(fd, len(header).to_bytes(8, "little") + header)
        if nbytes:
            data = host_array((x.view(view_as) if view_as is not x.dtype else x).reshape(-1))
            _write_all(fd, memoryview(data).cast("B"))
    finally:
        os.close(fd)
    return True


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
