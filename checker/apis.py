"""Which recorded API a dump name is, whether it can be replayed, and what kind of operation it is.

A dump names an API call ``<Family>.<api>.<n>.forward`` (``Functional.linear.3.forward``,
``Tensor.__mul__.0.forward``, ``Torch.matmul.1.forward``, msprobe's ``Aten.mm.0.forward``).
:func:`resolve` finds the function to replay, :func:`skip_reason` says in words why a call is
not replayed (random, in-place, communication, uninitialised memory, unknown), and
:func:`op_class` says what the standard of :mod:`probe.checker.standards` must know about it: its
class in the one table :data:`OPS` (exact, elementwise, transcendental, activation, reduction,
matmul, attention; an unlisted name by a stated default rule, never elementwise), and
:func:`reduction_length` how many terms each output element sums.

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
import re
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
#: every op the checker grades, by its name after the family (``Functional.gelu`` → ``gelu``), and
#: its class: how its output may differ from the exact result (the budgets and the reasons are
#: :data:`probe.checker.standards.CLASSES`). A name not listed gets :func:`op_class`'s default rule.
OPS: dict[str, str] = {
    name: cls for cls, names in {
        # copies, layout, indexing, comparisons, selections, integer results: bit-exact
        "exact": """view view_as reshape reshape_as transpose permute contiguous clone expand expand_as
            flatten unflatten squeeze unsqueeze narrow select chunk split split_with_sizes unbind stack
            cat concat concatenate hstack vstack t T mT repeat repeat_interleave tile roll flip gather
            index_select masked_fill where tril triu __getitem__ to type_as float half bfloat16 double
            int long bool zeros ones full zeros_like ones_like full_like arange tensor eye one_hot
            embedding __neg__ neg abs __abs__ sign relu relu6 hardtanh threshold max min amax amin
            argmax argmin maximum minimum clamp clip topk sort argsort isfinite isnan isinf logical_not
            logical_and logical_or __invert__ __and__ __or__ __xor__ __lt__ __le__ __gt__ __ge__
            __eq__ __ne__ lt le gt ge eq ne floor ceil round trunc __mod__ remainder fmod __floordiv__
            floor_divide movedim moveaxis swapaxes diagonal broadcast_to pad max_pool1d max_pool2d
            max_pool3d adaptive_max_pool1d adaptive_max_pool2d pixel_shuffle pixel_unshuffle unfold
            index_put masked_select nonzero unique hardshrink""",
        # one IEEE-rounded arithmetic operation per element
        "elementwise": """add __add__ __radd__ sub subtract __sub__ __rsub__ rsub mul multiply __mul__
            __rmul__ div divide true_divide __truediv__ __div__ square outer ger leaky_relu prelu
            softshrink""",
        # a libm-style function, or two or three chained roundings
        "transcendental": """exp exp2 expm1 log log2 log10 log1p sin cos tan tanh sinh cosh asin acos
            atan atan2 sigmoid silu mish softplus elu selu celu erf erfc erfinv pow __pow__ __rpow__
            float_power rsqrt sqrt logsigmoid hardswish hardsigmoid lgamma digamma reciprocal
            __rtruediv__ __rdiv__ softsign logit xlogy polar glu hypot""",
        # x·(1 + f(x))/2 and x − f(x): f is good to a few units of 1, not of 1 + f
        "activation": "gelu tanhshrink",
        # sums: the rounding error grows with the number of terms and their magnitude
        "reduction": """sum mean nansum nanmean norm vector_norm var std var_mean std_mean logsumexp
            prod cumsum cumprod softmax log_softmax softmin rms_norm layer_norm group_norm batch_norm
            instance_norm local_response_norm normalize cross_entropy nll_loss mse_loss l1_loss
            smooth_l1_loss huber_loss kl_div binary_cross_entropy binary_cross_entropy_with_logits
            cosine_similarity pairwise_distance avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d
            adaptive_avg_pool2d adaptive_avg_pool3d trace dist cdist frobenius_norm embedding_bag
            addcmul addcdiv lerp""",
        # products summed over an inner dimension of length K
        "matmul": """linear matmul mm bmm __matmul__ __rmatmul__ addmm baddbmm addbmm addmv mv dot
            vdot inner einsum bilinear tensordot chain_matmul conv1d conv2d conv3d conv_transpose1d
            conv_transpose2d conv_transpose3d""",
        # softmax(q·kᵀ·s)·v, with the projections of a multi-head attention
        "attention": """scaled_dot_product_attention multi_head_attention_forward
            _scaled_dot_product_attention_math _scaled_dot_product_flash_attention_for_cpu""",
    }.items() for name in names.split()
}
#: pure tensor operations the checker replays beyond :data:`OPS` (they compute from their tensor
#: and number arguments only); with :data:`OPS` the whole replay allow-list (:func:`refusal`)
PURE_EXTRA = frozenset("""
    absolute positive negative fix frac sinc heaviside nan_to_num signbit copysign ldexp logaddexp
    logaddexp2 isclose isreal isneginf isposinf clamp_min clamp_max bitwise_and bitwise_or bitwise_xor
    bitwise_not bitwise_left_shift bitwise_right_shift __lshift__ __rshift__ __rlshift__ __rrshift__
    __pos__ __rand__ __ror__ __rxor__ __rmod__ __rfloordiv__ logical_xor all any count_nonzero median
    nanmedian mode kthvalue quantile nanquantile cummax cummin logcumsumexp diff cross kron addr
    aminmax std var cov corrcoef rot90 fliplr flipud diag diag_embed diagflat block_diag cartesian_prod
    meshgrid atleast_1d atleast_2d atleast_3d dstack column_stack row_stack take take_along_dim scatter
    scatter_add scatter_reduce index_add index_copy index_fill masked_scatter bucketize searchsorted
    histc bincount renorm interpolate upsample grid_sample affine_grid fold channel_shuffle lp_pool1d
    lp_pool2d max_unpool1d max_unpool2d max_unpool3d cosine_embedding_loss margin_ranking_loss
    triplet_margin_loss soft_margin_loss multilabel_margin_loss multilabel_soft_margin_loss
    multi_margin_loss poisson_nll_loss gaussian_nll_loss hinge_embedding_loss ctc_loss logdet det
    slogdet inverse cholesky qr svd pinverse matrix_power matrix_exp triangular_solve linalg_solve
    new_zeros new_ones new_full new_tensor linspace logspace real imag view_as_real view_as_complex
    conj angle detach cpu expm1 clamp numel size dim view_as type softmin rsub silu
    native_layer_norm native_batch_norm native_group_norm _softmax _log_softmax _to_copy _unsafe_view
    _reshape_alias _scaled_mm _flash_attention_forward _efficient_attention_forward
    _scaled_dot_product_flash_attention _scaled_dot_product_efficient_attention
    _scaled_dot_product_cudnn_attention npu_fusion_attention npu_rms_norm npu_rotary_mul
    npu_swiglu""".split())
#: never replayed, whatever a table says: they read or write files, pickle, reach a process, a
#: device's memory or the network, or hand out raw memory (a crafted dump names them)
_NEVER = re.compile(r"save|load|hub|file|pickle|reduce|setstate|getstate|numpy|tolist|storage|"
                    r"share_memory|pin_memory|data_ptr|record_stream|mmap|open|dlpack|jit|compile|"
                    r"script|trace|export|profil|backend|library|classes|ops|distributed|"
                    r"multiprocessing|cuda|set_|__del__|__init__|__new__|__class__|__dict__")


def refusal(api: str) -> str | None:
    """Why a call of ``api`` is refused by the replay allow-list (None: it may be replayed).

    Only pure tensor operations are replayed: a name of :data:`OPS` or :data:`PURE_EXTRA` in a
    known family, with no dotted path (``Torch.hub.load``) and nothing that touches a file, a
    pickle, a process or raw memory (``Torch.save``, ``Tensor.__reduce_ex__``), whatever the
    tables say.

    >>> refusal("Functional.linear") is None, refusal("Torch.save")
    (True, 'not replayed: Torch.save is not a pure tensor operation on the replay allow-list')
    """
    attr = family_and_attr(api)[1]
    base = attr.rstrip("_") if not attr.startswith("__") else attr
    listed_pure = base in OPS or base in PURE_EXTRA
    if "." in attr or not listed_pure or (_NEVER.search(attr) and base not in _FRAGMENT_OK):
        return f"not replayed: {api} is not a pure tensor operation on the replay allow-list"
    return None


#: ops whose output's size their arguments give rather than their inputs' sizes (creation ops,
#: and ops that multiply sizes): :func:`requested_elements` reads it before the replay allocates
_SIZED = frozenset("""zeros ones full empty empty_strided new_zeros new_ones new_full new_empty
    new_empty_strided arange range linspace logspace eye one_hot repeat tile repeat_interleave expand
    broadcast_to outer ger kron cartesian_prod pad interpolate upsample bincount histc diag diag_embed
    diagflat block_diag cdist""".split())
#: "more than any limit": what an unreadable size argument (a float ``inf``) asks for
_UNBOUNDED = 1 << 62


def requested_elements(api: str, args: Any, kwargs: Any) -> int | None:
    """How many elements the output of a call of ``api`` with ``args`` and ``kwargs`` takes,
    read from its size arguments before anything is allocated, for the ops whose arguments give
    it (``torch.zeros(10**12)``, ``arange``, ``eye``, ``one_hot``, ``repeat``, ``outer``, ``pad``,
    ``interpolate``, ...); None for any other op (its output is the size of its inputs, each
    bounded when read) and where the arguments do not say.

    >>> requested_elements("Torch.zeros", [10**6, 10**6], {}), requested_elements("Torch.zeros", [[2, 3]], {})
    (1000000000000, 6)
    >>> requested_elements("Tensor.new_full", [torch.ones(1), [4, 5], 0.0], {})
    20
    >>> requested_elements("Torch.arange", [0, 1e12, 0.5], {}), requested_elements("Torch.exp", [torch.ones(3)], {})
    (2000000000000, None)
    """
    family, attr = family_and_attr(api)
    base = attr.rstrip("_")
    if base not in _SIZED:
        return None
    args = list(args) if isinstance(args, (list, tuple)) else []
    kwargs = kwargs if isinstance(kwargs, dict) else {}
    try:
        n = _requested(base, family, args, kwargs)
    except (TypeError, ValueError, OverflowError, IndexError, ZeroDivisionError, AttributeError):
        return None
    return None if n is None else max(0, min(int(n), _UNBOUNDED))


def _count(x: Any) -> int:
    """A size argument as a whole count (a float infinity or NaN: unbounded)."""
    if isinstance(x, bool):
        raise TypeError("a bool is no size")
    if isinstance(x, float):
        return _UNBOUNDED if not math.isfinite(x) or abs(x) >= _UNBOUNDED else math.ceil(x)
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_floating_point():
        return int(x.item())
    return int(x)


def _size(args: list, kwargs: dict, start: int, name: str = "size") -> list[int] | None:
    """A size given as a list or ``torch.Size`` at ``args[start]``, as ints from there on, or
    as ``kwargs[name]``."""
    given = kwargs.get(name) if name in kwargs else (args[start] if len(args) > start else None)
    if isinstance(given, (list, tuple)):
        return [_count(d) for d in given]
    if given is None:
        return None
    dims = []
    for d in args[start:] if name not in kwargs else [given]:
        if isinstance(d, (list, tuple, torch.Tensor, float, str, torch.dtype)) or d is None:
            break
        dims.append(_count(d))
    return dims


def _numel(x: Any) -> int:
    n = getattr(x, "numel", None)
    if callable(n):
        return int(n())
    shape = getattr(x, "shape", None)            # a recorded tensor not loaded
    return math.prod(int(d) for d in shape) if shape is not None else 1


def _requested(base: str, family: str, args: list, kwargs: dict) -> int | None:
    if base in ("zeros", "ones", "empty", "full", "empty_strided"):
        dims = _size(args, kwargs, 0)
    elif base.startswith("new_"):
        dims = _size(args, kwargs, 1)
    elif base in ("expand", "broadcast_to"):
        dims = _size(args, kwargs, 1, "size" if base == "expand" else "shape")
        tensor = args[0] if args else None
        if dims is not None and tensor is not None and hasattr(tensor, "shape"):
            own = list(tensor.shape)
            dims = [o if d == -1 and i >= len(dims) - len(own) else d
                    for i, (d, o) in enumerate(zip(dims, [1] * (len(dims) - len(own)) + own))]
    elif base in ("arange", "range"):
        nums = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
        start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums + [1])[:3] if nums else (0, None, 1)
        start, end, step = kwargs.get("start", start), kwargs.get("end", end), kwargs.get("step", step)
        if end is None or not step:
            return None
        span = (float(end) - float(start)) / float(step)
        return _UNBOUNDED if not math.isfinite(span) else max(0, math.ceil(span)) + (base == "range")
    elif base in ("linspace", "logspace"):
        return _count(kwargs["steps"] if "steps" in kwargs else args[2])
    elif base == "eye":
        n = _count(kwargs.get("n", args[0] if args else None))
        m = kwargs.get("m", args[1] if len(args) > 1 and isinstance(args[1], int) else None)
        return n * (_count(m) if m is not None else n)
    elif base == "one_hot":
        classes = _count(kwargs.get("num_classes", args[1] if len(args) > 1 else -1))
        return _numel(args[0]) * classes if classes > 0 else None
    elif base in ("repeat", "tile"):
        reps = _size(args, kwargs, 1, "repeats" if base == "repeat" else "dims")
        return _numel(args[0]) * math.prod(reps) if reps else None
    elif base == "repeat_interleave":
        r = kwargs.get("repeats", args[1] if len(args) > 1 else None)
        return _numel(args[0]) * _count(r) if isinstance(r, (int, float)) and not isinstance(r, bool) else None
    elif base in ("outer", "ger", "kron"):
        other = kwargs.get("vec2", kwargs.get("other", args[1] if len(args) > 1 else None))
        return _numel(args[0]) * _numel(other) if other is not None else None
    elif base == "cartesian_prod":
        return math.prod(_numel(a) for a in args) * max(len(args), 1)
    elif base == "pad":
        shape = list(args[0].shape)
        pads = [_count(p) for p in kwargs.get("pad", args[1] if len(args) > 1 else [])]
        for k in range(min(len(pads) // 2, len(shape))):
            shape[-1 - k] += pads[2 * k] + pads[2 * k + 1]
        dims = shape
    elif base in ("interpolate", "upsample"):
        shape = list(args[0].shape)
        size = kwargs.get("size", args[1] if len(args) > 1 else None)
        scale = kwargs.get("scale_factor", args[2] if len(args) > 2 else None)
        spatial = len(shape) - 2
        if size is not None:
            dims = shape[:2] + ([_count(d) for d in size] if isinstance(size, (list, tuple)) else [_count(size)] * spatial)
        elif scale is not None:
            scales = list(scale) if isinstance(scale, (list, tuple)) else [scale] * spatial
            dims = shape[:2] + [_count(math.floor(d * float(s))) for d, s in zip(shape[2:], scales)]
        else:
            return None
    elif base == "bincount":
        return max(_count(kwargs.get("minlength", args[2] if len(args) > 2 else 0)), _numel(args[0]))
    elif base == "histc":
        return _count(kwargs.get("bins", args[1] if len(args) > 1 else 100))
    elif base in ("diag", "diag_embed", "diagflat"):
        offset = abs(_count(kwargs.get("offset", kwargs.get("diagonal", args[1] if len(args) > 1 and
                                                              isinstance(args[1], int) else 0))))
        n = _numel(args[0])
        if base == "diag" and getattr(args[0], "dim", lambda: 1)() != 1:
            return None                  # the diagonal of a matrix: smaller than it
        last = list(getattr(args[0], "shape", [n]))[-1:] or [1]
        return n * (last[0] + offset) if base == "diag_embed" else (n + offset) ** 2
    elif base == "block_diag":
        rows = sum(int(a.shape[0]) if a.dim() > 1 else 1 for a in args)
        cols = sum(int(a.shape[-1]) if a.dim() else 1 for a in args)
        return rows * cols
    elif base == "cdist":
        a, b = args[0], args[1]
        return _numel(a) // max(int(a.shape[-1]), 1) * int(b.shape[-2])
    else:
        return None
    if dims is None or any(d < 0 for d in dims):
        return None
    return math.prod(dims)


#: allow-listed names that :data:`_NEVER` would catch by a fragment (``trace`` the matrix trace)
_FRAGMENT_OK = frozenset({"trace", "scatter_reduce", "huber_loss"})
#: the default rule for a name :data:`OPS` lacks, first match wins: a name that says what it is
#: gets that class; any other is graded as a reduction over its last dimension (an unknown op may
#: reduce while keeping its shape, as ``normalize`` and ``cumsum`` do; never elementwise)
_NAME_RULES = ((re.compile(r"attention|attn"), "attention"), (re.compile(r"conv|matmul|linear|mm$"), "matmul"),
               (re.compile(r"gelu"), "activation"))
#: where a call's dropout probability is, for the APIs that draw dropout inside (position, name)
_DROPOUT_P = {"scaled_dot_product_attention": (4, "dropout_p"), "multi_head_attention_forward": (10, "dropout_p")}
#: the terms each output element of these sums: ``addcmul``: x + v·a·b
_FIXED_K = {"addcmul": 2, "addcdiv": 2, "lerp": 3}
#: reductions whose terms are products or sums of the inputs: the magnitude of the terms is the
#: same call on the inputs' absolute values (the bound of the rounding error of a sum)
ABS_REPLAYABLE = {"linear", "matmul", "mm", "bmm", "__matmul__", "__rmatmul__", "mv", "dot",
                  "inner", "einsum", "sum", "mean", "nansum", "nanmean", "cumsum", "conv1d",
                  "conv2d", "conv3d", "addmm", "baddbmm", "addmv", "avg_pool1d", "avg_pool2d",
                  "trace", "addcmul", "addcdiv"}


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


def skip_reason(api: str, kwargs: Any = (), args: Any = ()) -> str | None:
    """Why a call of ``api`` is not replayed (None: it is). ``kwargs``: the call's keyword
    arguments (or only their names); ``args``: its positional ones, where known.

    >>> skip_reason("Functional.scaled_dot_product_attention", {"dropout_p": 0.1})
    'random: scaled_dot_product_attention drops attention weights at random (dropout_p=0.1)'
    """
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
    p = _dropout_p(attr, kwargs, args)
    if p:
        return f"random: {attr} drops attention weights at random (dropout_p={p:g})"
    if "out" in kwargs:
        return "in-place: the call writes into its out= tensor"
    if attr in _UNINITIALISED:
        return f"not replayable: {attr} returns uninitialised memory"
    return None


def _dropout_p(attr: str, kwargs: Any, args: Any) -> float:
    """The dropout probability a call of ``attr`` applied (0 where it has none or is not training)."""
    where = _DROPOUT_P.get(attr)
    if where is None or not isinstance(kwargs, dict):
        return 0.0
    pos, name = where
    p = kwargs.get(name, args[pos] if len(args) > pos else 0.0)
    training = kwargs.get("training", args[13] if attr == "multi_head_attention_forward" and len(args) > 13 else True)
    return float(p) if isinstance(p, (int, float)) and training is not False else 0.0


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
    """``exact``, ``elementwise``, ``transcendental``, ``activation``, ``reduction``, ``matmul`` or
    ``attention``: the name's entry in :data:`OPS`, else the first of :data:`_NAME_RULES` that
    matches it, else ``reduction``.

    >>> op_class("Functional.multi_head_attention_forward"), op_class("Aten._scaled_mm"), op_class("Torch.frobnicate")
    ('attention', 'matmul', 'reduction')
    """
    attr = family_and_attr(api)[1]
    base = attr.rstrip("_") if not attr.startswith("__") else attr
    cls = OPS.get(base)
    if cls is not None:
        return cls
    for pattern, rule in _NAME_RULES:
        if pattern.search(base):
            return rule
    return "reduction"


def listed(api: str) -> bool:
    """Whether :data:`OPS` names ``api`` (else its class is the default rule's guess)."""
    attr = family_and_attr(api)[1]
    return (attr.rstrip("_") if not attr.startswith("__") else attr) in OPS


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
    if attr in _FIXED_K:
        return _FIXED_K[attr]
    if attr == "scaled_dot_product_attention":
        k = tensors[1] if len(tensors) > 1 else first
        return int(first.shape[-1]) + int(k.shape[-2])
    if attr == "multi_head_attention_forward":
        # in-projection (E), q·k per head (E/heads), softmax and p·v over the keys (S), out-projection (E)
        e, key = int(first.shape[-1]), tensors[1] if len(tensors) > 1 else first
        heads = kwargs.get("num_heads", args[4] if len(args) > 4 else 1)
        heads = heads if isinstance(heads, int) and heads > 0 else 1
        return 2 * e + max(e // heads, 1) + int(key.shape[0])
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
    cls = op_class(api)
    if cls in ("reduction", "matmul", "attention"):
        n_out = int(out.numel()) if out is not None and out.numel() else 1
        k = max(int(first.numel()) // n_out, 1)
        # an unlisted op may reduce along its last dimension and keep its shape
        return k if listed(api) else max(k, int(first.shape[-1]) if first.dim() else 1)
    return 1
