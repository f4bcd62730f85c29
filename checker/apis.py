"""Which recorded API a dump name is, whether it can be replayed, and what kind of operation it is.

A dump names an API call ``<Family>.<api>.<n>.forward`` (``Functional.linear.3.forward``,
``Tensor.__mul__.0.forward``, ``Torch.matmul.1.forward``, msprobe's ``Aten.mm.0.forward``).
:func:`resolve` finds the function to replay, :func:`skip_reason` says in words why a call is
not replayed (random, in-place, communication, uninitialised memory, unknown), and
:func:`op_class` says what the standard of :mod:`probe.checker.standards` must know about it: exact
(indexing, copies, comparisons), elementwise, transcendental or a reduction, and how long the
reduction is.

>>> split_name("Functional.linear.3.forward")
('Functional.linear', 3)
>>> skip_reason("Functional.dropout"), skip_reason("Tensor.add_")
('random: dropout draws new random numbers on every call', 'in-place: the call overwrites its input')
>>> op_class("Tensor.__add__"), op_class("Torch.exp"), op_class("Functional.linear")
('elementwise', 'transcendental', 'matmul')
>>> resolve("Aten.mm") is torch.ops.aten.mm, resolve("Aten.no_such_op"), resolve("Mint.add")
(True, None, None)
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch

#: ``<Family>.`` → where its functions live
_FAMILIES = {
    "Torch": lambda a: getattr(torch, a, None),
    "Functional": lambda a: getattr(torch.nn.functional, a, None),
    "Tensor": lambda a: getattr(torch.Tensor, a, None),
    "Aten": lambda a: _aten(a),
}

_RANDOM = {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
           "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "randperm",
           "bernoulli", "multinomial", "normal", "poisson", "rrelu", "gumbel_softmax",
           "fractional_max_pool2d", "fractional_max_pool3d", "native_dropout"}
_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
                  "empty_with_format"}
#: results that are exact whatever the precision: copies, layout, indexing, comparisons, integers
_EXACT = {
    "view", "view_as", "reshape", "reshape_as", "transpose", "permute", "contiguous", "clone",
    "expand", "expand_as", "flatten", "unflatten", "squeeze", "unsqueeze", "narrow", "select",
    "chunk", "split", "split_with_sizes", "unbind", "stack", "cat", "concat", "concatenate",
    "hstack", "vstack", "t", "T", "mT", "repeat", "repeat_interleave", "tile", "roll", "flip",
    "gather", "index_select", "masked_fill", "where", "tril", "triu", "__getitem__",
    "to", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool",
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "arange", "tensor",
    "eye", "one_hot", "embedding", "__neg__", "neg", "abs", "__abs__", "sign", "relu",
    "max", "min", "amax", "amin", "argmax", "argmin", "maximum", "minimum", "clamp", "clip",
    "topk", "sort", "argsort", "isfinite", "isnan", "isinf", "logical_not", "logical_and",
    "logical_or", "__invert__", "__and__", "__or__", "__xor__", "__lt__", "__le__", "__gt__",
    "__ge__", "__eq__", "__ne__", "lt", "le", "gt", "ge", "eq", "ne", "floor", "ceil",
    "round", "trunc", "__mod__", "remainder", "fmod", "__floordiv__", "floor_divide",
    "outer_index", "movedim", "moveaxis", "swapaxes", "diagonal", "broadcast_to", "pad",
}
_TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "tanh",
    "sinh", "cosh", "asin", "acos", "atan", "atan2", "sigmoid", "silu", "gelu", "mish", "softplus",
    "elu", "selu", "celu", "erf", "erfc", "erfinv", "pow", "__pow__", "__rpow__", "float_power",
    "rsqrt", "sqrt", "logsigmoid", "hardswish", "lgamma", "digamma", "reciprocal", "__rtruediv__",
    "softsign", "tanhshrink", "logit", "xlogy", "polar",
}
_MATMUL = {"linear", "matmul", "mm", "bmm", "__matmul__", "__rmatmul__", "addmm", "baddbmm",
           "addbmm", "addmv", "mv", "dot", "vdot", "inner", "einsum", "bilinear", "tensordot",
           "scaled_dot_product_attention"}
_REDUCE = {"sum", "mean", "nansum", "nanmean", "norm", "vector_norm", "var", "std", "var_mean",
           "std_mean", "logsumexp", "prod", "cumsum", "cumprod", "softmax", "log_softmax",
           "rms_norm", "layer_norm", "group_norm", "batch_norm", "instance_norm", "normalize",
           "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss",
           "kl_div", "binary_cross_entropy", "binary_cross_entropy_with_logits", "cosine_similarity",
           "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "avg_pool1d",
           "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d", "adaptive_avg_pool2d", "trace",
           "dist", "cdist", "frobenius_norm"}
#: reductions whose terms are products or sums of the inputs: the magnitude of the terms is the
#: same call on the inputs' absolute values (the bound of the rounding error of a sum)
ABS_REPLAYABLE = {"linear", "matmul", "mm", "bmm", "__matmul__", "__rmatmul__", "mv", "dot",
                  "inner", "einsum", "sum", "mean", "nansum", "nanmean", "cumsum", "conv1d",
                  "conv2d", "conv3d", "addmm", "baddbmm", "addmv", "avg_pool1d", "avg_pool2d",
                  "trace"}


def _aten(attr: str) -> Any:
    """``torch.ops.aten.<attr>`` (msprobe's ``Aten.*`` names), or None."""
    try:
        return getattr(torch.ops.aten, attr)
    except (AttributeError, RuntimeError):
        return None


def split_name(name: str) -> tuple[str, int]:
    """``(api, call index)`` of a forward entry name (``Functional.linear.3.forward``)."""
    parts = name.split(".")
    if len(parts) >= 4 and parts[-1] == "forward" and parts[-2].isdigit():
        return ".".join(parts[:-2]), int(parts[-2])
    return ".".join(parts[:-1]) if parts[-1] == "forward" else name, -1


def family_and_attr(api: str) -> tuple[str, str]:
    """``("Functional", "linear")`` of ``Functional.linear``."""
    family, _, attr = api.partition(".")
    return family, attr


def is_inplace(attr: str) -> bool:
    """``add_``, ``__iadd__``, ``__setitem__``: the call overwrites its first input."""
    if attr.startswith("__i") and attr.endswith("__"):
        return True
    return attr == "__setitem__" or (attr.endswith("_") and not attr.endswith("__"))


def skip_reason(api: str, kwargs_names: Any = ()) -> str | None:
    """Why a call of ``api`` is not replayed (None: it is)."""
    family, attr = family_and_attr(api)
    if family == "Distributed":
        return "communication: a collective needs the other ranks"
    if family not in _FAMILIES or not attr:
        return f"not replayable: no {family!r} API family here (Torch, Functional, Tensor, Aten)"
    if attr in _RANDOM or attr.startswith(("rand", "random_", "normal_", "uniform_", "bernoulli_",
                                            "exponential_", "cauchy_", "geometric_", "log_normal_")):
        return f"random: {attr} draws new random numbers on every call"
    if is_inplace(attr):
        return "in-place: the call overwrites its input"
    if "out" in kwargs_names:
        return "in-place: the call writes into its out= tensor"
    if attr in _UNINITIALISED:
        return f"not replayable: {attr} returns uninitialised memory"
    return None


def resolve(api: str) -> Callable | None:
    """The function a dump name stands for, as the framework defines it (not a wrapper that a
    dump or a planted fault put in front of it), or None."""
    family, attr = family_and_attr(api)
    find = _FAMILIES.get(family)
    fn = find(attr) if find is not None else None
    for _ in range(8):      # a dump's wrapper and a fault's wrapper, in either order
        inner = getattr(fn, "__probe_original__", None) or getattr(fn, "__probe_fault_original__", None)
        if inner is None:
            break
        fn = inner
    return fn if callable(fn) else None


def op_class(api: str) -> str:
    """``exact``, ``elementwise``, ``transcendental``, ``matmul`` or ``reduction``."""
    attr = family_and_attr(api)[1]
    base = attr.rstrip("_") if not attr.startswith("__") else attr
    if base in _EXACT:
        return "exact"
    if base in _MATMUL:
        return "matmul"
    if base in _REDUCE:
        return "reduction"
    if base in _TRANSCENDENTAL:
        return "transcendental"
    return "elementwise"


def reduction_length(api: str, args: list, kwargs: dict, out: torch.Tensor | None) -> int:
    """How many terms each output element sums (1 for an elementwise op).

    >>> reduction_length("Functional.linear", [torch.ones(2, 64), torch.ones(8, 64)], {}, None)
    64
    """
    attr = family_and_attr(api)[1]
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    first = tensors[0] if tensors else None
    if first is None:
        return 1
    if attr == "linear":
        return max(int(first.shape[-1]) if first.dim() else 1, 1)
    if attr in ("matmul", "mm", "bmm", "__matmul__", "mv", "dot", "vdot", "inner", "tensordot"):
        return max(int(first.shape[-1]) if first.dim() else 1, 1)
    if attr == "__rmatmul__":
        return max(int(first.shape[-2]) if first.dim() > 1 else int(first.numel()), 1)
    if attr in ("addmm", "baddbmm", "addbmm", "addmv") and len(tensors) >= 2:
        return max(int(tensors[1].shape[-1]), 1)
    if attr == "scaled_dot_product_attention":
        k = tensors[1] if len(tensors) > 1 else first
        return int(first.shape[-1]) + int(k.shape[-2])
    if attr in ("softmax", "log_softmax", "cumsum", "cumprod"):
        dim = kwargs.get("dim", args[1] if len(args) > 1 and isinstance(args[1], int) else -1)
        try:
            return max(int(first.shape[dim]), 1)
        except (IndexError, TypeError):
            return max(int(first.shape[-1]) if first.dim() else 1, 1)
    if attr in ("rms_norm", "layer_norm", "group_norm", "normalize"):
        shape = kwargs.get("normalized_shape", args[1] if len(args) > 1 else None)
        if isinstance(shape, (list, tuple)) and shape and all(isinstance(s, int) for s in shape):
            return max(math.prod(shape), 1)
        return max(int(first.shape[-1]) if first.dim() else 1, 1)
    if attr.startswith("conv") and len(tensors) >= 2:
        w = tensors[1]
        return max(int(w[0].numel()), 1)
    if op_class(api) in ("reduction", "matmul"):
        n_out = int(out.numel()) if out is not None and out.numel() else 1
        return max(int(first.numel()) // n_out, 1)
    return 1
