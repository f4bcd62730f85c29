"""Trace the bundled engine's training, one rank per distinct pipeline stage, on fake tensors.

Two ways, by what the engine can run:

1. a layout it runs (data parallel only, one microbatch per step, float32 or its bfloat16
   autocast): its own loop, :func:`probe.engine.train.run_rank`, runs unchanged inside
   :class:`~probe.simulator.fake_run.FakeRun` as rank 0 of ``dp`` ranks (a ``fake`` process group
   answers its gradient all-reduce), for two optimizer steps;
2. anything else (``--tp``, ``--pp``, several microbatches, float16): each distinct stage of
   :class:`~probe.simulator.shard_model.ShardLlama` (first, middle, last; one when ``pp`` is 1)
   trains two steps of one microbatch each as the engine trains: float32 weights, gradients
   and AdamW state, forward and loss under autocast to the 16-bit dtype when one is asked for.
   Received activations and gradients of pipeline neighbours are fake tensors of their shape,
   with their sends and receives recorded.

>>> from probe.simulator.layout import make_layout
>>> lay = make_layout(nproc=2, global_batch=8)
>>> traced = trace_engine("tiny", "reference", "float32", lay)
>>> traced.params, len(traced.ranks), traced.ranks[0].ranks
(131904, 1, [0, 1])
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Any, Callable

import torch

from probe.engine.config import ModelConfig, get_preset
from probe.simulator.fake_run import FakeRun
from probe.simulator.layout import Layout
from probe.simulator.shard_model import ShardLlama, check_shardable
from probe.simulator.trace import OpTracer
from probe.simulator.workload import RankTrace, Traced

#: ``--dtype`` -> the dtype the forward and the loss compute in (autocast below float32)
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
TRACED_STEPS = 2


def trace_engine(preset: str, engine: str, dtype: str, layout: Layout, *, seq_len: int | None = None,
                 signatures: bool = False, progress: Callable[[str], None] | None = None) -> Traced:
    """Trace ``preset`` of the bundled ``engine`` in ``layout`` (see the module docstring);
    ``progress`` hears one line once the inputs are checked and tracing starts."""
    cfg = get_preset(preset).with_overrides(seq_len=seq_len, global_batch=layout.global_batch)
    check_shardable(cfg, layout.tp, layout.pp)
    if progress is not None:
        progress(f"tracing {engine}/{preset} on fake tensors ({layout.nproc} ranks) ...")
    describe = {"workload": "bundled engine", "engine": engine, "preset": preset,
                "dtype": dtype, "seq_len": cfg.seq_len, "micro_batch": layout.micro_batch}
    from probe.engine.train import DTYPES as ENGINE_DTYPES

    engine_dtype = next((k for k, v in DTYPES.items() if v == dtype), None)
    runs_as_is = layout.tp == layout.pp == 1 and layout.microbatches == 1 and engine_dtype in ENGINE_DTYPES
    if runs_as_is:
        return _trace_loop(preset, engine, engine_dtype, cfg, layout, describe, signatures)
    notes = [] if engine == "reference" else [
        f"the {engine} engine has no tensor/pipeline-parallel or float16 form; simulated as the "
        "reference engine's model sharded Megatron-style"]
    describe["engine"] = "reference (sharded)"
    return _trace_shards(cfg, dtype, layout, describe, notes, signatures)


def _trace_loop(preset: str, engine: str, dtype: str, cfg: ModelConfig, layout: Layout,
                describe: dict, signatures: bool) -> Traced:
    from probe.engine.spec import RunSpec
    from probe.engine.train import run_rank
    from probe.monitor.address import ADDR_ENV

    out = tempfile.mkdtemp(prefix="probe-simulate-")
    spec = RunSpec(engine=engine, preset=preset, nproc=layout.dp, max_steps=TRACED_STEPS,
                   out_dir=out, quiet=True, global_batch=layout.global_batch, seq_len=cfg.seq_len,
                   fsync="never", owner="simulate", dtype=dtype)
    threads, monitor = torch.get_num_threads(), os.environ.pop(ADDR_ENV, None)
    try:
        with FakeRun(world_size=layout.dp, quiet_reads=True, signatures=signatures) as run:
            run_rank(spec, 0, layout.dp)
    finally:
        torch.set_num_threads(threads)
        if monitor is not None:
            os.environ[ADDR_ENV] = monitor
        shutil.rmtree(out, ignore_errors=True)
    rank = RankTrace(label="every rank", ranks=list(range(layout.nproc)), trace=run.tracer.trace)
    return Traced([rank], run.tracer.trace.params, DTYPES[dtype], describe)


def _trace_shards(cfg: ModelConfig, dtype: str, layout: Layout, describe: dict, notes: list[str],
                  signatures: bool) -> Traced:
    per_stage = cfg.n_layers // layout.pp
    kinds: dict[tuple[bool, bool], Any] = {}
    ranks: list[RankTrace] = []
    for stage in range(layout.pp):
        first, last = stage == 0, stage == layout.pp - 1
        if (first, last) not in kinds:
            layers = range(stage * per_stage, (stage + 1) * per_stage)
            kinds[(first, last)] = _trace_stage(cfg, dtype, layout, layers, first, last, signatures)
        trace, windows = kinds[(first, last)]
        label = "every rank" if layout.pp == 1 else f"pipeline stage {stage} of {layout.pp}"
        ranks.append(RankTrace(label=label, ranks=layout.stage_ranks(stage), trace=trace,
                               in_flight=min(layout.pp - stage, layout.microbatches),
                               windows=windows, holds=_holds(cfg, layout, stage),
                               stage=stage, first=first, last=last))
    return Traced(ranks, _full_params(cfg), dtype, describe, notes)


def _holds(cfg: ModelConfig, layout: Layout, stage: int) -> str:
    """What a rank of ``stage`` holds, in words."""
    per = cfg.n_layers // layout.pp
    parts = [f"layers {stage * per}-{(stage + 1) * per - 1}"]
    if stage == 0:
        parts.insert(0, "the embedding")
    if stage == layout.pp - 1:
        parts.append("the final norm and LM head")
    what = ", ".join(parts)
    if layout.tp > 1:
        what += (f"; of each, 1/{layout.tp} of the heads, FFN features and vocabulary "
                 "(tensor parallel), norms whole")
    return what


def _trace_stage(cfg: ModelConfig, dtype: str, layout: Layout, layers: range, first: bool,
                 last: bool, signatures: bool) -> tuple[Any, list[tuple[int, int, int]]]:
    windows: list[tuple[int, int, int]] = []
    with FakeRun(quiet_reads=True, signatures=signatures) as run:
        tracer = run.tracer

        def record(op: str, group: str, nbytes: int) -> None:
            tracer.comm(op, group, layout.group_size(group), nbytes)

        model = ShardLlama(cfg, tp=layout.tp, layers=layers, first=first, last=last, record=record)
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01, foreach=False)
        low = getattr(torch, dtype) if dtype != "float32" else None
        for _ in range(TRACED_STEPS):
            optimizer.zero_grad(set_to_none=True)
            windows.append(_microbatch(model, cfg, layout, low, tracer))
            optimizer.step()
    return tracer.trace, windows


def _microbatch(model: ShardLlama, cfg: ModelConfig, layout: Layout, low: torch.dtype | None,
                tracer: OpTracer) -> tuple[int, int, int]:
    """One microbatch's forward (under autocast to ``low``, if given) and backward on this
    stage; its (start, forward end, end)."""
    b, t, local_vocab = layout.micro_batch, cfg.seq_len, cfg.vocab_size // layout.tp
    start = tracer.trace.n_ops
    if model.first:
        x = torch.randint(0, local_vocab, (b, t))
    else:
        x = torch.empty(b, t, cfg.d_model, dtype=low or torch.float32, requires_grad=True)
        tracer.comm("recv", "pp", 2, x.numel() * x.element_size())
    with torch.autocast("cpu", dtype=low) if low is not None else contextlib.nullcontext():
        out = model(x)
        if model.last:
            loss = model.loss(out, torch.randint(0, local_vocab, (b, t)))
    if model.last:
        forward_end = tracer.trace.n_ops
        loss.backward()
    else:
        tracer.comm("send", "pp", 2, out.numel() * out.element_size())
        forward_end = tracer.trace.n_ops
        grad = torch.empty_like(out)
        tracer.comm("recv", "pp", 2, grad.numel() * grad.element_size())
        out.backward(grad)
    if not model.first:
        tracer.comm("send", "pp", 2, x.numel() * x.element_size())
    return start, forward_end, tracer.trace.n_ops


def _full_params(cfg: ModelConfig) -> int:
    """The exact parameter count of the unsharded reference model (built on fake tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from probe.engine.models import build_model

    with FakeTensorMode():
        model = build_model("reference", cfg)
        return sum(p.numel() for p in model.parameters())
