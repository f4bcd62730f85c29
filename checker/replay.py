"""Replaying one recorded API call on a trusted backend in higher precision, and grading it.

:func:`check_call` takes a call's API name, its inputs as they were at the call (tensors
loaded, or live tensors in an online check) and its measured outputs:

1. a call that cannot be replayed faithfully is skipped with the reason in words
   (:func:`probe.checker.apis.skip_reason`: random, in-place, communication, uninitialised memory;
   an API this framework does not have; a tensor the dump did not save; a name off the replay
   allow-list of pure tensor operations, :func:`probe.checker.apis.refusal`: never a file, a
   pickle or a process);
2. every floating input is cast to the golden dtype on the golden device (integers and bools
   stay as they are), a floating ``dtype=`` argument is raised to the golden dtype too (except
   in casts: ``x.to(torch.bfloat16)`` stays a cast), devices become the golden device;
3. the framework's own function (never a dump's or a planted fault's wrapper in front of it)
   runs with autocast off and gradients off;
4. for a matmul-like or summing call, the magnitude of the terms, the scale of the
   accumulation error (:mod:`probe.checker.standards`): for a matrix product the product of the row
   and column norms, else the same call on the inputs' absolute values; for an activation the
   input's magnitude; for an attention a bound on its largest logit (:func:`_logit_bound`);
5. :func:`probe.checker.grade.grade` grades each measured output against the golden.

>>> import torch
>>> x = torch.randn(4, 8)
>>> w = torch.randn(3, 8)
>>> row = check_call("Functional.linear", [x, w], {}, [torch.nn.functional.linear(x, w)], GOLDENS["cpu-fp64"])
>>> row["verdict"], row["k"]
('pass', 8)
>>> check_call("Functional.dropout", [x], {}, [x], GOLDENS["cpu-fp64"])["reason"]
'random: dropout draws new random numbers on every call'
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from probe.checker.apis import (ABS_REPLAYABLE, family_and_attr, op_class, reduction_length, refusal, resolve,
                                requested_elements, skip_reason)
from probe.checker.grade import METRICS, grade
from probe.checker.standards import standard
from probe.ground.errors import ProbeError


@dataclass(frozen=True)
class Golden:
    """Where and in what precision the golden runs."""

    name: str
    device: str
    dtype: torch.dtype


GOLDENS = {
    "cpu-fp64": Golden("cpu-fp64", "cpu", torch.float64),
    "cpu-fp32": Golden("cpu-fp32", "cpu", torch.float32),
    "cuda-fp64": Golden("cuda-fp64", "cuda", torch.float64),
}

#: casts: their dtype argument is what they do, not a precision to raise
_CASTS = {"to", "type", "type_as", "float", "half", "bfloat16", "double", "int", "long", "bool",
          "view", "view_as"}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def golden(name: str) -> Golden:
    """The golden backend called ``name`` (``cpu-fp64``, ``cpu-fp32``, ``cuda-fp64``)."""
    g = GOLDENS.get(name)
    if g is None:
        raise ProbeError(f"--golden {name!r}: use one of {', '.join(GOLDENS)}")
    if g.device == "cuda" and not torch.cuda.is_available():
        raise ProbeError(f"--golden {name}: CUDA is not available on this machine; use --golden cpu-fp64")
    return g


def row_for(api: str, verdict: str, reason: str, **fields: Any) -> dict[str, Any]:
    """One result row (the columns of :data:`probe.checker.report.COLUMNS` that a check sets)."""
    row = {"api": api, "op": op_class(api), "dtype": None, "shape": None, "k": None,
           "verdict": verdict, "reason": reason, **dict.fromkeys(METRICS)}
    row.update(fields)
    return row


def check_call(api: str, args: list, kwargs: dict, measured: list, gold: Golden,
               missing: str | None = None) -> dict[str, Any]:
    """Replay one call of ``api`` and grade ``measured`` (its recorded outputs); see the
    module docstring. Returns a result row."""
    reason = skip_reason(api, kwargs if isinstance(kwargs, dict) else {}, args)
    if reason is not None:
        return row_for(api, "skipped", reason)
    if missing is not None:
        return row_for(api, "skipped", f"not replayable: the dump holds no tensor file {missing!r} "
                                       "(dump with --task tensor)")
    fn = resolve(api)
    if fn is None:
        return row_for(api, "skipped", f"not replayable: this PyTorch has no {api}")
    refused = refusal(api)
    if refused is not None:
        return row_for(api, "skipped", refused)
    refused = _too_big(api, args, kwargs, gold)
    if refused is not None:
        return row_for(api, "skipped", refused)
    outs = flat_tensors(measured)
    if not outs:
        return row_for(api, "skipped", "not graded: the call returned no tensor")
    first = outs[0]
    k = reduction_length(api, args, kwargs, first)
    in_dtype = _most_precise_input(args, kwargs)
    attr = family_and_attr(api)[1]
    opmath = torch.float64 if first.dtype == torch.float64 else torch.float32
    g_args, g_kwargs = _to_golden(args, gold, attr, opmath), _to_golden(kwargs, gold, attr, opmath)
    if attr in ("__getitem__", "__setitem__") and len(g_args) > 1 and isinstance(g_args[1], list):
        g_args = [g_args[0], _index(g_args[1], first), *g_args[2:]]
    try:
        std = standard(api, str(first.dtype), k,
                       _logit_bound(attr, g_args, g_kwargs) if op_class(api) == "attention" else 0.0)
        gold_out = flat_tensors(_run(fn, g_args, g_kwargs, gold))
        terms = None
        if attr.rstrip("_") in ABS_REPLAYABLE and std.op in ("matmul", "reduction"):
            bound = _product_bound(attr, g_args, g_kwargs)
            terms = [bound] if bound is not None else \
                flat_tensors(_run(fn, _absolute(g_args), _absolute(g_kwargs), gold))
        elif std.op == "activation":
            x = next((t for t in flat_tensors(g_args) if t.is_floating_point()), None)
            terms = [x.abs().broadcast_to(o.shape) for o in gold_out] if x is not None else None
    except Exception as e:  # noqa: BLE001 - any failure of the replay is a skip with its reason
        msg = str(e).splitlines()[0] if str(e) else ""
        return row_for(api, "skipped", f"not replayable on {gold.name}: {type(e).__name__}: {msg[:160]}",
                       dtype=str(first.dtype), shape=list(first.shape), k=k)
    result = grade([o.detach().cpu() for o in outs], [o.detach().cpu() for o in gold_out],
                   [t.detach().cpu() for t in terms] if terms is not None else None, std, in_dtype)
    return row_for(api, result.verdict, result.reason, dtype=str(first.dtype), shape=list(first.shape),
                   k=k, **result.metrics)


def _too_big(api: str, args: list, kwargs: dict, gold: Golden) -> str | None:
    """Why a call whose arguments ask for a tensor larger than one tensor may take
    (:func:`probe.ground.files.max_tensor_bytes`, in the golden's precision) is not replayed: a
    crafted ``torch.zeros(10**12)`` is refused before anything is allocated. None: it may be."""
    from probe.ground.files import TENSOR_LIMIT_VARIABLE, max_tensor_bytes

    n = requested_elements(api, args, kwargs if isinstance(kwargs, dict) else {})
    if n is None:
        return None
    width = max(gold.dtype.itemsize, 8)          # float64 golden; an int64 result as wide
    limit = max_tensor_bytes()
    if n * width <= limit:
        return None
    return (f"not replayed: {api}'s arguments ask for a tensor of {n} elements ({n * width} bytes on "
            f"{gold.name}), more than the {limit} one tensor may take (${TENSOR_LIMIT_VARIABLE} raises it)")


def _index(index: list, out: torch.Tensor) -> Any:
    """A recorded index as the call had it: a dump writes a tuple index (``x[1:, 0]``) and a
    list index (``x[[0, 2]]``) alike; a tuple unless it is a list of integers whose result's
    leading size is the list's length."""
    if all(type(i) is int for i in index) and out.dim() and out.shape[0] == len(index):
        return index
    return tuple(index)


def _run(fn: Any, args: list, kwargs: dict, gold: Golden) -> Any:
    with torch.no_grad(), torch.autocast("cpu", enabled=False):
        if gold.device == "cuda":
            with torch.autocast("cuda", enabled=False):
                return fn(*args, **kwargs)
        return fn(*args, **kwargs)


def flat_tensors(x: Any) -> list[torch.Tensor]:
    """The tensors of ``x`` (a tensor, or nested tuples/lists of them), in order."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in flat_tensors(v)]
    return []


def _most_precise_input(args: Any, kwargs: Any) -> str | None:
    best = None
    for t in flat_tensors([args, list(kwargs.values()) if isinstance(kwargs, dict) else []]):
        if t.is_floating_point() and (best is None or torch.finfo(t.dtype).eps < torch.finfo(best).eps):
            best = t.dtype
    return str(best) if best is not None else None


def _to_golden(x: Any, gold: Golden, attr: str, opmath: torch.dtype) -> Any:
    """``x`` on the golden backend; a Python float as the kernel sees it (rounded to the
    float32 it computes in, unless it computes in float64)."""
    if type(x) is float:
        return float(torch.tensor(x, dtype=opmath)) if opmath != torch.float64 else x
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.dtype in _FLOATS:
            return t.to(device=gold.device, dtype=gold.dtype)
        return t.to(device=gold.device)
    if isinstance(x, torch.dtype):
        return gold.dtype if x in _FLOATS and attr not in _CASTS else x
    if isinstance(x, torch.device):
        return torch.device(gold.device)
    if isinstance(x, list):
        return [_to_golden(v, gold, attr, opmath) for v in x]
    if isinstance(x, tuple):
        return tuple(_to_golden(v, gold, attr, opmath) for v in x)
    if isinstance(x, dict):
        return {k: (gold.device if k == "device" and isinstance(v, str) else _to_golden(v, gold, attr, opmath))
                for k, v in x.items()}
    return x


def _product_bound(attr: str, args: list, kwargs: dict) -> torch.Tensor | None:
    """For a matrix product, a bound on the magnitude of each output's terms without a second
    product: ``sum_k |a_k b_k| <= ||a|| ||b||`` (Cauchy-Schwarz; for dense rows about 1.6 times
    the sum itself), from the row norms of one operand and the column norms of the other, plus
    ``|bias|``. None where the call is not a plain product of two matrices (then the call is
    replayed on absolute values)."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if len(tensors) < 2 or tensors[0].dim() < 2 or tensors[1].dim() < 2 or not tensors[0].is_floating_point():
        return None
    a, b = tensors[0], tensors[1]
    with torch.no_grad():
        if attr == "linear":
            bound = torch.linalg.vector_norm(a, dim=-1, keepdim=True) * torch.linalg.vector_norm(b, dim=-1)
            bias = tensors[2] if len(tensors) > 2 else kwargs.get("bias")
            return bound + bias.abs() if isinstance(bias, torch.Tensor) else bound
        if attr in ("matmul", "mm", "bmm", "__matmul__"):
            return torch.linalg.vector_norm(a, dim=-1, keepdim=True) * torch.linalg.vector_norm(b, dim=-2, keepdim=True)
        if attr == "__rmatmul__":
            return torch.linalg.vector_norm(b, dim=-1, keepdim=True) * torch.linalg.vector_norm(a, dim=-2, keepdim=True)
    return None


def _logit_bound(attr: str, args: list, kwargs: dict) -> float:
    """A bound on an attention's largest logit ``|q·k·s|`` (Cauchy-Schwarz: the largest query
    norm times the largest key norm times the scale), plus the largest finite additive mask.
    For ``multi_head_attention_forward`` the queries and keys are its in-projections. 0 where
    the call's arguments are not as expected."""
    a = _bind(attr, args, kwargs)
    q, k = a.get("query"), a.get("key")
    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor) or not q.is_floating_point():
        return 0.0
    with torch.no_grad():
        if attr == "multi_head_attention_forward":
            e, heads = int(q.shape[-1]), a.get("num_heads")
            w = a.get("in_proj_weight")
            w_q, w_k = (w[:e], w[e:2 * e]) if isinstance(w, torch.Tensor) else (a.get("q_proj_weight"), a.get("k_proj_weight"))
            b = a.get("in_proj_bias")
            b_q, b_k = (b[:e], b[e:2 * e]) if isinstance(b, torch.Tensor) else (None, None)
            if not isinstance(w_q, torch.Tensor) or not isinstance(w_k, torch.Tensor) or not isinstance(heads, int):
                return 0.0
            static_k = a.get("static_k")
            q = torch.nn.functional.linear(q, w_q, b_q)
            k = static_k if isinstance(static_k, torch.Tensor) else torch.nn.functional.linear(k, w_k, b_k)
            scale = 1.0 / math.sqrt(max(e // max(heads, 1), 1))
        else:
            scale = a.get("scale")
            scale = float(scale) if isinstance(scale, (int, float)) else 1.0 / math.sqrt(max(int(q.shape[-1]), 1))
        norms = [float(torch.linalg.vector_norm(t, dim=-1).max()) if t.numel() else 0.0 for t in (q, k)]
        bound = norms[0] * norms[1] * abs(scale)
        mask = a.get("attn_mask")
        if isinstance(mask, torch.Tensor) and mask.is_floating_point() and mask.numel():
            finite = mask[mask.isfinite()]
            bound += float(finite.abs().max()) if finite.numel() else 0.0
    return bound if math.isfinite(bound) else 0.0


#: the parameter names of the calls whose arguments :func:`_logit_bound` reads, in order
_PARAMS = {
    "scaled_dot_product_attention": ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale"),
    "multi_head_attention_forward": (
        "query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias",
        "bias_k", "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training",
        "key_padding_mask", "need_weights", "attn_mask", "use_separate_proj_weight", "q_proj_weight",
        "k_proj_weight", "v_proj_weight", "static_k", "static_v"),
}


def _bind(attr: str, args: list, kwargs: dict) -> dict[str, Any]:
    """The call's arguments by name (:data:`_PARAMS`)."""
    return {**dict(zip(_PARAMS.get(attr, ()), args)), **(kwargs if isinstance(kwargs, dict) else {})}


def _absolute(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.abs() if x.is_floating_point() else x
    if isinstance(x, list):
        return [_absolute(v) for v in x]
    if isinstance(x, tuple):
        return tuple(_absolute(v) for v in x)
    if isinstance(x, dict):
        return {k: (abs(v) if k in ("alpha", "beta", "value") and isinstance(v, (int, float)) else _absolute(v))
                for k, v in x.items()}
    return x
