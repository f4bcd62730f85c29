"""API-level interception for MindSpore: ``mindspore.ops`` (``Functional.*``), ``mindspore.mint``
(``Mint.*``) and ``Tensor`` methods (``Tensor.*``, operators included), forward calls.

Each public function is replaced by a thin wrapper while the dump is attached and put back
on detach. Inputs are described before the call runs (in-place ops record the value as it was
at the call); calls made inside a recorded call are not recorded again.
"""

from __future__ import annotations

import functools
import types
from typing import Any

import mindspore as ms
from mindspore import mint, ops

_OPERATOR_DUNDERS = {
    f"__{n}__" for n in (
        "add radd iadd sub rsub isub mul rmul imul truediv rtruediv itruediv floordiv rfloordiv "
        "mod rmod pow rpow matmul rmatmul neg pos abs invert and rand or ror xor rxor eq ne lt le "
        "gt ge getitem setitem").split()
}
_TENSOR_SKIP = {"asnumpy", "numpy", "item", "tolist", "register_hook", "size", "dim", "ndimension",
                "numel", "nelement", "stride", "storage_offset", "data_ptr", "itemsize", "nbytes",
                "init_data", "set_data", "assign_value", "is_contiguous", "is_persistent_data",
                "data_sync", "flush_from_cache", "offload", "move_to", "set_dtype", "asnumpy_of_slice_persistent_data",
                "slice_num_of_persistent_data", "slice_shape_of_persistent_data", "has_init", "init_flag",
                "is_init", "is_signed", "is_floating_point", "is_complex", "ndim", "shape", "dtype",
                "requires_grad_", "backward", "detach", "untyped_storage", "storage"}


def _plain(obj: Any) -> bool:
    return isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
                            types.WrapperDescriptorType))


def api_table() -> list[tuple[Any, str, str, Any]]:
    """Every wrapped API: ``(owner, attribute, dump name, original)``."""
    table: list[tuple[Any, str, str, Any]] = []
    for owner, prefix in ((ops, "Functional"), (mint, "Mint")):
        for attr in dir(owner):
            if attr.startswith("_") or attr[0].isupper():
                continue
            orig = getattr(owner, attr, None)
            if _plain(orig):
                table.append((owner, attr, f"{prefix}.{attr}", orig))
    for attr in dir(ms.Tensor):
        if attr in _TENSOR_SKIP or attr.startswith("is_") or (attr.startswith("_") and attr not in _OPERATOR_DUNDERS):
            continue
        orig = ms.Tensor.__dict__.get(attr, None) or getattr(ms.Tensor, attr, None)
        if _plain(orig):
            table.append((ms.Tensor, attr, f"Tensor.{attr}", orig))
    return table


class MindSporeApi:
    """Installs and removes the wrappers for one sink."""

    def __init__(self, sink: Any, guard: Any) -> None:
        self.sink = sink
        self.guard = guard
        self._patched: list[tuple[Any, str, Any]] = []

    def _wrap(self, orig: Any, api: str) -> Any:
        sink, guard = self.sink, self.guard

        @functools.wraps(orig)
        def wrapper(*args, **kwargs):
            if guard.depth or not sink.active:
                return orig(*args, **kwargs)
            with guard:
                token = sink.api_call(api, args, kwargs)
                output = orig(*args, **kwargs)
                sink.api_return(token, output)
                return output

        wrapper.__probe_original__ = orig
        return wrapper

    def install(self) -> None:
        for owner, attr, name, orig in api_table():
            if getattr(orig, "__probe_original__", None) is not None:
                continue
            try:
                setattr(owner, attr, self._wrap(orig, name))
            except (TypeError, AttributeError):
                continue
            self._patched.append((owner, attr, orig))

    def uninstall(self) -> None:
        patched, self._patched = self._patched, []
        for owner, attr, orig in reversed(patched):
            setattr(owner, attr, orig)
