"""PyTorch tensor statistics: one stacked reduction per tensor, on its device, one gather per step.

For a floating tensor the statistics are ``[max, min, sum, sumsq, nan_count, inf_count]``,
computed where the tensor lives:

- on an accelerator, one stacked reduction per tensor (``aminmax``; the sum, the sum of squares
  and the NaN and Inf counts in float64 over chunks of :data:`DEVICE_CHUNK` elements: see
  :func:`_reduce_device`) left on the device as a handle; nothing reaches the host until
  :meth:`TorchStats.gather` stacks every handle of the step and reads it with one
  ``tolist()`` per device: no host-device synchronisation per tensor;
- on the CPU the tensor already is on the host: one pass of a small native kernel (compiled
  once per machine with the system C compiler, cached under ``~/.cache/probe``) reads max,
  min, sum, sum of squares and NaN/Inf counts at memory speed, a large tensor on torch's own
  OpenMP threads (each reads the share it just wrote, still in its core's cache). Without a compiler the same
  numbers come from a zero-copy NumPy view (:func:`probe.engine_adapter.host_stats.array_stats`).
  The handle is then the finished list.

:meth:`TorchStats.identity` keys a tensor by its bytes (address, dtype, extent, version), valid
while its storage lives (:meth:`TorchStats.owner`), so the recorder reads the same data once a
step however many tensor objects and views show it.

>>> import torch
>>> s = TorchStats()
>>> t = torch.tensor([1.0, -2.0, float("inf")])
>>> s.gather([s.reduce(t, s.describe(t).kind)])[0]
[inf, -2.0, inf, inf, 0.0, 1.0]
"""

from __future__ import annotations

import os
import zlib
from typing import Any, Sequence

import numpy as np
import torch

from probe.engine_adapter.base import FLOAT, INTEGER, OPAQUE, StatsBackend, TensorMeta
from probe.engine_adapter.host_stats import array_stats

_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}
_INTS = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
for _name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz"):
    if hasattr(torch, _name):
        _FLOATS.add(getattr(torch, _name))
_NATIVE = {torch.float32, torch.float64}
_DTYPE_STR: dict[torch.dtype, str] = {}


def _dtype_str(dtype: torch.dtype) -> str:
    s = _DTYPE_STR.get(dtype)
    if s is None:
        s = _DTYPE_STR[dtype] = str(dtype)
    return s


_dense = torch.ops.aten.is_non_overlapping_and_dense
_KIND = {**{dt: FLOAT for dt in _FLOATS}, **{dt: INTEGER for dt in _INTS}}
_STRIDED = torch.strided


def _identity(t: torch.Tensor, dtype: torch.dtype, numel: int) -> tuple | None:
    """:meth:`TorchStats.identity` of ``t`` (its ``dtype`` and ``numel`` given: the hot path
    has them). Views share their base's version counter, so equal keys mean equal bytes while
    the first tensor lives. A dense tensor (no gaps, no overlap) covers exactly the block
    [data_ptr, data_ptr + numel) whatever its shape and strides: its reshapes, transposes and
    permutes hold the same values in another order, and max/min/sum/sum of squares and NaN/Inf
    counts do not depend on the order."""
    try:
        if t.is_contiguous() or _dense(t):
            return t.data_ptr(), dtype, numel, t._version
        return t.data_ptr(), dtype, t.shape, t.stride(), t._version
    except RuntimeError:            # no storage (sparse, meta, some tensor subclasses)
        return None


_PLAIN = (torch.Tensor, torch.nn.Parameter)
_NO_DISPATCH = torch.Tensor.__torch_dispatch__


def readable(t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """``(data, note)``: the tensor whose bytes hold ``t``'s values, safe to read, and what the
    dump entry should say about it (None: nothing to say); ``data`` is None when nothing can be
    read, and ``note`` then says why. Every statistics, hash and copy of a tensor goes through
    this first: FSDP and ZeRO-3 free a sharded parameter's storage between uses (``resize_(0)``,
    ``Tensor.set_``) while the tensor object keeps its shape, and reading it then reads freed
    memory (a crash, or another tensor's bytes).

    - a plain tensor: itself, when its storage holds every byte it covers (not freed, not
      resized below it, not a meta tensor's);
    - a DTensor: its local part (no collective: reading the whole would need one); a shard is
      marked as such in the note, a replicated one is the whole tensor;
    - another tensor subclass with its own dispatch (a wrapper without memory of its own): None.

    >>> t = torch.ones(4)
    >>> readable(t)[0] is t
    True
    >>> _ = t.untyped_storage().resize_(0)
    >>> readable(t)
    (None, 'storage freed (resized to 0 bytes, as FSDP and ZeRO-3 do with sharded parameters): not read')
    >>> readable(torch.empty(2, device="meta"))[1]
    'meta tensor: no data to read'
    """
    cls = type(t)
    if cls is not torch.Tensor and cls is not torch.nn.Parameter and cls.__torch_dispatch__ != _NO_DISPATCH:
        return _readable_subclass(t)
    if t.is_meta:
        return None, "meta tensor: no data to read"
    if t.layout is not _STRIDED or t.numel() == 0:
        return t, None
    try:
        storage = t.untyped_storage()
        nbytes, base = storage.nbytes(), storage.data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None, "tensor without storage: not read"
    if nbytes == 0:
        return None, ("storage freed (resized to 0 bytes, as FSDP and ZeRO-3 do with sharded "
                      "parameters): not read")
    extent = t.storage_offset() + 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    if base == 0 or extent * t.element_size() > nbytes:
        return None, f"storage of {nbytes} bytes is smaller than the tensor's extent: not read"
    return t, None


def _readable_subclass(t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
    """:func:`readable` of a tensor subclass with its own ``__torch_dispatch__``."""
    local = getattr(t, "_local_tensor", None)
    placements = getattr(t, "placements", None)
    if not isinstance(local, torch.Tensor) or placements is None:
        if type(t).__module__.startswith("probe."):     # the dump's own stand-ins: no data
            return None, None
        return None, f"tensor subclass {type(t).__name__} without data of its own: not read"
    data, note = readable(local)
    if data is None:
        return None, f"local part of a DTensor: {note}"
    kinds = {type(p).__name__ for p in placements}
    if kinds <= {"Replicate"}:
        return data, None
    mesh = getattr(t, "device_mesh", None)
    where = ""
    try:
        coordinate = mesh.get_coordinate() if mesh is not None else None
        if coordinate is not None:
            where = f" at mesh coordinate {list(coordinate)} of {list(mesh.shape)}"
    except Exception:  # noqa: BLE001 - the mesh's position is only for the note
        pass
    what = "partial (not reduced) values" if "Partial" in kinds else "shard"
    return data, (f"DTensor {tuple(placements)}: statistics of this rank's {what} "
                  f"{list(data.shape)}{where}, not of the whole tensor {list(t.shape)}")


class TorchStats(StatsBackend):
    """:class:`~probe.engine_adapter.base.StatsBackend` for ``torch.Tensor``."""

    tensor_type = torch.Tensor
    tensor_suffix = ".pt"

    def describe(self, t: torch.Tensor) -> TensorMeta:
        # quantized dtypes are in neither table: dtype and shape only, as complex and bool
        dtype = t.dtype
        numel = t.numel()
        kind = _KIND.get(dtype, OPAQUE) if numel and t.layout is _STRIDED else OPAQUE
        return TensorMeta("torch.Tensor", _DTYPE_STR.get(dtype) or _dtype_str(dtype), t.shape,
                          numel, t.requires_grad, kind)

    def identity(self, t: torch.Tensor) -> tuple | None:
        return _identity(t, t.dtype, t.numel())

    def inspect(self, t: torch.Tensor) -> tuple:
        # describe() and identity() in one call: the dump asks both of every tensor it sees
        dtype = t.dtype
        numel = t.numel()
        kind = _KIND.get(dtype, OPAQUE) if numel and t.layout is _STRIDED else OPAQUE
        return ("torch.Tensor", _DTYPE_STR.get(dtype) or _dtype_str(dtype), t.shape, numel,
                t.requires_grad, kind, _identity(t, dtype, numel))

    def native_spec(self) -> dict:
        """What the dump's native row builder (``dumper/_rows_native.c``) needs to read a
        plain tensor as :meth:`inspect`, :meth:`owner` and :meth:`reduce` do: the tensor types
        it takes, every dtype's name, kind and kernel code (1 float32, 2 float64, 0 neither),
        the strided layout, and the addresses of the native kernel's two entry points (0
        without the kernel: it then calls :meth:`reduce`)."""
        import ctypes

        kernel = native_kernel()
        f32 = f64 = 0
        if kernel:
            f32 = ctypes.cast(kernel[0], ctypes.c_void_p).value or 0
            f64 = ctypes.cast(kernel[1], ctypes.c_void_p).value or 0
        dtypes = {dt: (_dtype_str(dt), _KIND.get(dt, OPAQUE),
                       1 if dt == torch.float32 else 2 if dt == torch.float64 else 0)
                  for dt in {v for v in vars(torch).values() if isinstance(v, torch.dtype)}}
        return {"tensor_types": (torch.Tensor, torch.nn.Parameter), "dtypes": dtypes,
                "strided": _STRIDED, "type_name": "torch.Tensor",
                "f32": f32, "f64": f64}

    def owner(self, t: torch.Tensor) -> Any:
        # the storage: its Python object lives as long as the memory does (torch keeps it for
        # every view), so a key stays valid after the first tensor object read is gone while
        # another view still holds the bytes (a gradient handed on as a new view object)
        try:
            return t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return t

    def readable(self, t: torch.Tensor) -> tuple[torch.Tensor | None, str | None]:
        return readable(t)

    def reduce(self, t: torch.Tensor, kind: str) -> torch.Tensor | list[float] | None:
        if kind == OPAQUE:
            return None
        t = readable(t)[0]          # callers read readable() first; this is the last guard
        if t is None:
            return None
        if t.is_cpu:
            return _reduce_host(t, kind)
        return _reduce_device(t, kind)

    def gather(self, handles: Sequence[Any]) -> list[list[float] | None]:
        by_device: dict[torch.device, list[int]] = {}
        out: list[list[float] | None] = [None] * len(handles)
        for i, h in enumerate(handles):
            if isinstance(h, list):
                out[i] = h
            elif h is not None:
                by_device.setdefault(h.device, []).append(i)
        for idx in by_device.values():
            floats = [i for i in idx if handles[i].numel() == 6]
            ints = [i for i in idx if handles[i].numel() != 6]
            for group in (floats, ints):
                if not group:
                    continue
                values = torch.stack([handles[i].to(torch.float64) for i in group]).tolist()
                for i, v in zip(group, values):
                    out[i] = v
        return out

    def digest(self, t: torch.Tensor) -> str | None:
        data = readable(t)[0]
        if data is None:
            return None
        x = data.detach()
        if not x.is_cpu:
            x = x.cpu()
        x = x.contiguous()
        if x.dtype in (torch.bfloat16,) or not _numpy_ok(x.dtype):
            x = x.view(torch.int16) if x.element_size() == 2 else x.view(torch.uint8)
        from probe.engine_adapter.torch_safetensors import host_array
        arr = host_array(x)
        return f"{zlib.crc32(memoryview(arr).cast('B')) & 0xFFFFFFFF:08x}"

    def save(self, tensors: dict[str, Any], path: str) -> None:
        if path.endswith((".pt", ".npy")):                  # msprobe's files: one tensor each
            (t,) = tensors.values()
            (write_pt if path.endswith(".pt") else _write_npy)(t, path)
            return
        if len(tensors) == 1 and "tensor" in tensors:      # the dump's one tensor per file
            from probe.engine_adapter.torch_safetensors import write_tensor
            if write_tensor(tensors["tensor"], path):
                return
        if os.path.islink(path):
            raise OSError(f"{path}: a symbolic link, not followed")
        from safetensors.torch import save_file
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, path)

    def snapshot(self, t: torch.Tensor) -> torch.Tensor | None:
        # a copy in memory runs at memory speed; the file write it replaces costs the page
        # cache's (several times slower here), and goes to the dump's writer thread instead
        from probe.engine_adapter.torch_safetensors import writable
        if not writable(t):
            return None
        x = t.detach()
        return x.clone(memory_format=torch.contiguous_format) if x.is_cpu else x.cpu()

    def scalar_type(self, x: Any) -> str | None:
        if isinstance(x, torch.dtype):
            return "torch.dtype"
        if isinstance(x, torch.device):
            return "torch.device"
        if isinstance(x, torch.Size):
            return "torch.Size"
        return None


def write_pt(t: torch.Tensor, path: str) -> None:
    """``t`` as msprobe's PyTorch dump writes it: ``torch.save`` of the tensor, on the host,
    detached, holding its own storage only (a view of a larger tensor is copied out, so the file
    is not the whole base), to ``path`` opened without following a link.

    >>> import os, tempfile
    >>> base = torch.arange(100.0)
    >>> p = os.path.join(tempfile.mkdtemp(), "t.pt")
    >>> write_pt(base[10:16].view(2, 3).t(), p)
    >>> got = torch.load(p, weights_only=True)
    >>> got.tolist(), got.untyped_storage().nbytes()
    ([[10.0, 13.0], [11.0, 14.0], [12.0, 15.0]], 24)
    """
    from probe.engine_adapter.tensor_files import open_new

    x = t.detach()
    if not x.is_cpu:
        x = x.cpu()
    if x.layout is torch.strided and not (
            x.is_contiguous() and x.storage_offset() == 0
            and x.untyped_storage().nbytes() == x.numel() * x.element_size()):
        x = x.clone(memory_format=torch.contiguous_format)
    with open_new(path) as f:
        torch.save(x, f)


def _write_npy(t: torch.Tensor, path: str) -> None:
    """``t`` as a ``.npy`` file (bfloat16 as the float32 values it holds, NumPy having none)."""
    from probe.engine_adapter.tensor_files import write_npy
    from probe.engine_adapter.torch_safetensors import host_array

    x = t.detach()
    if x.dtype == torch.bfloat16:
        x = x.float()
    if not _numpy_ok(x.dtype):
        raise TypeError(f"{path}: a {x.dtype} tensor has no .npy form")
    x = x.cpu().contiguous()
    write_npy(host_array(x).reshape(tuple(x.shape)), path)


#: the native kernel's source, beside this file
_KERNEL_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stats_kernel.c")

_kernel: Any = None


def _load_kernel() -> Any:
    """The one-pass CPU statistics kernel (compiled once per machine and cached), or False.

    One pass over the data gives max, min, sum, sum of squares and NaN/Inf counts; built
    against the libgomp torch runs (its own copy in a pip wheel), a large tensor is read by
    torch's OpenMP threads, each the share it wrote (see ``stats_kernel.c``). Without a C
    compiler the NumPy path below is used instead (three passes).
    """
    global _kernel
    if _kernel is not None:
        return _kernel
    _kernel = False
    try:
        import ctypes

        from probe.ground.native import load_cached

        gomp = _torch_openmp()
        # linked to the libgomp already loaded, so it shares torch's threads; else serial
        variants = ([["-fopenmp", gomp, f"-Wl,-rpath,{os.path.dirname(gomp)}"]] if gomp else []) + [[]]
        dll = load_cached(_KERNEL_SOURCE, "stats", variants, key_extra=str(gomp), what="the statistics kernel")
        if dll is None:
            return _kernel
        for name in ("probe_stats_f32", "probe_stats_f64"):
            fn = getattr(dll, name)
            fn.argtypes = (ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p)
            fn.restype = None
        for name in ("probe_adam_f32", "probe_adam_f64"):
            fn = getattr(dll, name)
            fn.argtypes = (ctypes.c_void_p,) * 3 + (ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
            fn.restype = None
        out = np.zeros(6, dtype=np.float64)
        _kernel = (dll.probe_stats_f32, dll.probe_stats_f64, out, out.ctypes.data,
                   dll.probe_adam_f32, dll.probe_adam_f64)
    except Exception:  # noqa: BLE001 - no compiler, no cache dir: the NumPy path works everywhere
        _kernel = False
    return _kernel


def native_kernel() -> Any:
    """The loaded native kernel's entry points ``(stats_f32, stats_f64, out, out_ptr, adam_f32,
    adam_f64)``, or False without one (no compiler, ``PROBE_NATIVE=0``)."""
    return _kernel if _kernel is not None else _load_kernel()


def _torch_openmp() -> str | None:
    """The libgomp torch loaded into this process (its own copy in a pip wheel), or None when
    torch runs another OpenMP runtime or none."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith("libgomp") and ".so" in path:
                    return path
    except OSError:
        pass
    return None


#: Elements of a device tensor turned into float64 at a time for its sum and sum of squares
#: (32 MB of float64): the statistics' memory stays this much, not a float64 copy of the tensor.
DEVICE_CHUNK = 1 << 22
#: Float dtypes the device reductions take as they are (others, float8, are read as float32).
_DEVICE_FLOATS = {torch.float16, torch.bfloat16, torch.float32, torch.float64}


def _reduce_device(t: torch.Tensor, kind: str) -> torch.Tensor:
    """Statistics of a tensor on an accelerator, left there: a float64 tensor of
    ``[max, min, sum, sumsq, nan_count, inf_count]`` (``[max, min]`` for an integer tensor) that
    :meth:`TorchStats.gather` reads with the step's others; no host synchronisation.

    The sum and the sum of squares accumulate in float64, as the host kernel's do, over
    :data:`DEVICE_CHUNK` elements at a time: in float32, ``x . x`` overflows to inf once the
    values pass ~1.8e19, where the host path gives the finite sum (a diverging layer's norm
    then read inf on a GPU and finite on the CPU), and a float64 copy of the whole tensor
    (what ``torch.sum(x, dtype=torch.float64)`` makes) doubles a large activation's memory. The
    NaN and Inf counts are taken per chunk too, with ``count_nonzero`` of its masks, exact as
    float64: over the whole tensor, ``isnan(x).sum()`` made an int64 copy (8 bytes per element)
    and ``isinf(x)`` a copy of ``abs(x)``; a 400 MB float32 tensor's statistics took 0.86 GB and
    0.48 GB more memory that way. Half and bfloat16 tensors are read as they are (no float32
    copy). Written for a GPU; the tests run it on CPU tensors too."""
    with torch.no_grad():
        x = t.detach().reshape(-1)
        if kind == INTEGER:
            mn, mx = torch.aminmax(x)
            return torch.stack([mx, mn]).to(torch.float64)
        if x.dtype not in _DEVICE_FLOATS:
            x = x.float()
        f64 = torch.float64
        mn, mx = torch.aminmax(x)
        parts = []
        for chunk in x.split(DEVICE_CHUNK):
            # the counts from the chunk as it is (half the bytes of its float64 copy)
            counts = torch.stack([torch.count_nonzero(torch.isnan(chunk)),
                                  torch.count_nonzero(torch.isinf(chunk))]).to(f64)
            part = chunk.to(f64)
            parts.append(torch.cat([torch.stack([part.sum(), torch.dot(part, part)]), counts]))
        rest = parts[0] if len(parts) == 1 else torch.stack(parts).sum(0)
        return torch.cat([torch.stack([mx, mn]).to(f64), rest])


def _reduce_host(x: torch.Tensor, kind: str) -> list[float]:
    """Statistics of a CPU tensor: one native pass over its memory, or a zero-copy NumPy view."""
    if kind == FLOAT and x.dtype not in _NATIVE:
        x = x.detach().float()
    if not x.is_contiguous():
        # a dense tensor (a transpose, a permute) holds the block [data_ptr, + numel) in another
        # order: read it as it lies (the statistics do not depend on the order), no copy
        x = x.detach()
        x = x.as_strided((x.numel(),), (1,)) if _dense(x) else x.contiguous()
    if kind == FLOAT:
        kernel = _kernel if _kernel is not None else _load_kernel()
        if kernel:
            f32, f64, out, out_ptr = kernel[:4]
            (f32 if x.dtype == torch.float32 else f64)(x.data_ptr(), x.numel(), out_ptr)
            return out.tolist()
    from probe.engine_adapter.torch_safetensors import host_array
    a = host_array(x.detach())
    if kind == INTEGER:
        return [float(a.max()), float(a.min())]
    return array_stats(a, float(x.sum()))


def _numpy_ok(dtype: torch.dtype) -> bool:
    return dtype in (torch.float16, torch.float32, torch.float64, torch.bool, *_INTS)
