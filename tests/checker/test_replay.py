"""Replaying one call: the golden, the skips, the wrappers it looks through, what it grades."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from probe.checker.apis import resolve, skip_reason
from probe.checker.replay import GOLDENS, check_call, golden
from probe.ground.errors import ProbeError

CPU64 = GOLDENS["cpu-fp64"]


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_fp32_reductions_and_elementwise_calls_pass_against_a_float64_golden():
    x, w = _rand(8, 32, 688), _rand(256, 688, seed=1) * 0.05
    cases = [("Functional.linear", [x, w], {}), ("Functional.softmax", [x], {"dim": -1}),
             ("Torch.matmul", [x[0], x[0].T], {}), ("Tensor.sum", [x, -1], {}), ("Tensor.__mul__", [x, x], {}),
             ("Functional.silu", [x], {}), ("Torch.exp", [x.clamp(max=5)], {}),
             ("Functional.rms_norm", [x, [688]], {"eps": 1e-6}), ("Tensor.__truediv__", [x, 3.0], {})]
    for api, args, kwargs in cases:
        fn = resolve(api)
        row = check_call(api, args, kwargs, [fn(*args, **kwargs)], CPU64)
        assert row["verdict"] == "pass", (api, row["reason"])


def test_an_autocast_bf16_matmul_is_flagged_and_a_bf16_elementwise_op_passes():
    x, w = _rand(8, 32, 256), _rand(128, 256, seed=1) * 0.05
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.linear(x, w)
    row = check_call("Functional.linear", [x, w], {}, [out], CPU64)
    assert row["verdict"] in ("warning", "error"), row["reason"]
    assert "computed in bfloat16 from float32 inputs" in row["reason"] and row["k"] == 256
    y = out.detach()
    row = check_call("Tensor.__mul__", [y, y], {}, [y * y], CPU64)
    assert row["verdict"] == "pass", row["reason"]


def test_random_inplace_communication_and_uninitialised_calls_are_skipped_with_the_reason():
    x = _rand(4, 4)
    assert check_call("Functional.dropout", [x], {}, [x], CPU64)["reason"].startswith("random:")
    assert check_call("Tensor.add_", [x, 1.0], {}, [x], CPU64)["reason"].startswith("in-place:")
    assert check_call("Torch.add", [x, x], {"out": x}, [x], CPU64)["reason"].startswith("in-place:")
    assert check_call("Distributed.all_reduce", [x], {}, [x], CPU64)["reason"].startswith("communication:")
    assert "uninitialised" in check_call("Torch.empty", [[4, 4]], {}, [x], CPU64)["reason"]
    assert "no Torch.not_an_api" in check_call("Torch.not_an_api", [x], {}, [x], CPU64)["reason"]
    assert "no tensor file" in check_call("Torch.exp", [None], {}, [x], CPU64, missing="a.safetensors")["reason"]
    assert skip_reason("Functional.linear") is None


def test_a_call_the_golden_cannot_run_is_skipped_with_its_error():
    row = check_call("Functional.linear", [_rand(2, 3), _rand(4, 5)], {}, [_rand(2, 4)], CPU64)
    assert row["verdict"] == "skipped" and "not replayable on cpu-fp64: RuntimeError" in row["reason"]


def test_the_golden_is_the_framework_function_not_a_wrapper_in_front_of_it():
    orig = torch.nn.functional.gelu

    def wrong(*a, **k):
        return orig(*a, **k) * 2
    wrong.__probe_fault_original__ = orig
    try:
        torch.nn.functional.gelu = wrong
        x = _rand(16)
        assert resolve("Functional.gelu") is orig
        row = check_call("Functional.gelu", [x], {}, [wrong(x)], CPU64)
        assert row["verdict"] == "error" and "biased away from zero" in row["reason"]
    finally:
        torch.nn.functional.gelu = orig


def test_a_recorded_index_replays_as_the_tuple_or_list_it_was():
    x = _rand(4, 6)
    assert check_call("Tensor.__getitem__", [x, [slice(None), 1]], {}, [x[:, 1]], CPU64)["verdict"] == "pass"
    assert check_call("Tensor.__getitem__", [x, [0, 2]], {}, [x[[0, 2]]], CPU64)["verdict"] == "pass"
    assert check_call("Tensor.__getitem__", [x, [0, 2]], {}, [x[0, 2]], CPU64)["verdict"] == "pass"


def test_scalars_take_the_precision_the_kernel_computes_in():
    x = _rand(1000)
    row = check_call("Tensor.__truediv__", [x, 0.1], {}, [x / 0.1], CPU64)
    assert row["verdict"] == "pass", row["reason"]


def test_a_golden_that_is_not_here_is_one_line():
    with pytest.raises(ProbeError, match="use one of"):
        golden("tpu-fp64")
    if not torch.cuda.is_available():
        with pytest.raises(ProbeError, match="CUDA is not available"):
            golden("cuda-fp64")


def _bf16_accumulated(terms: torch.Tensor) -> torch.Tensor:
    """The sum over the last dimension as a kernel that accumulates in bfloat16 computes it."""
    acc = torch.zeros(*terms.shape[:-1], 1, dtype=torch.bfloat16)
    for i in range(terms.shape[-1]):
        acc = acc + terms[..., i:i + 1]
    return acc


def test_bf16_softmax_and_norms_are_graded_as_bf16_reductions_and_flagged_when_they_accumulate_in_bf16():
    # bfloat16 in, bfloat16 out (a model run in bf16 weights and activations): PyTorch's kernels
    # accumulate in float32 and round once, within the bf16 standard; the same reductions
    # accumulated in bfloat16 lose precision beyond it and are errors
    x = _rand(4, 16, 688).bfloat16()
    s = (_rand(4, 4, 64, 64, seed=1) * 3).bfloat16()
    for api, args, kwargs in (("Functional.softmax", [s], {"dim": -1}), ("Tensor.mean", [x, -1], {"keepdim": True}),
                              ("Functional.rms_norm", [x, [688]], {"eps": 1e-6})):
        row = check_call(api, args, kwargs, [resolve(api)(*args, **kwargs)], CPU64)
        assert row["verdict"] == "pass" and row["dtype"] == "torch.bfloat16", (api, row["reason"])
        assert row["reason"].startswith("within the bfloat16 standard for a") and "-term reduction" in row["reason"]
    e = (s - s.amax(-1, keepdim=True)).exp()
    naive = {"Functional.softmax": e / _bf16_accumulated(e),
             "Tensor.mean": _bf16_accumulated(x) / 688,
             "Functional.rms_norm": x * torch.rsqrt(_bf16_accumulated(x * x) / 688 + 1e-6)}
    for api, args, kwargs in (("Functional.softmax", [s], {"dim": -1}), ("Tensor.mean", [x, -1], {"keepdim": True}),
                              ("Functional.rms_norm", [x, [688]], {"eps": 1e-6})):
        row = check_call(api, args, kwargs, [naive[api]], CPU64)
        assert row["verdict"] in ("warning", "error"), (api, row["reason"])
        assert "beyond the bfloat16 standard" in row["reason"] and "float32 accumulation" in row["reason"]
