"""The training loop of one rank of the bundled engine.

Each step: fetch the synthetic batch, forward, cross-entropy, backward, all-reduce the
gradients (one flat bucket through ``torch.distributed.all_reduce``), AdamW. The loop marks
its phases with ``mstx`` ranges (domain ``step``: ``step N``; ``engine``: forward, backward,
optimizer; ``dataloader``: fetch), writes per-step metric points to the rank's store (each
step durable when it ends), and calls the training callbacks (:mod:`probe.engine_adapter.callbacks`).

Rank 0 shows progress (:mod:`probe.engine.progress`, unless ``spec.quiet``). Every rank's loss rides
in the gradients' all-reduce, so after it every rank knows them all: a NaN or Inf loss (or
gradient norm) is reported by rank 0 in one line on stderr at the step it happens (``probe:
rank 1 step 3: loss = nan; ...``), and unless ``spec.allow_nan`` every rank stops after that
step (its records are written); the command then exits with
:data:`probe.ground.errors.EXIT_NONFINITE`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from probe.collectors.store import StoreWriter
from probe.engine_adapter.callbacks import CallbackList, CallbackSpec, TrainContext
from probe.engine_adapter.run_config import RunConfigCallback
from probe.engine.config import get_preset
from probe.engine.data import make_batch
from probe.engine.faults import FaultPlanter, check_faults, parse_faults
from probe.engine.models import build_model, init_reference_state, load_weights_file
from probe.engine.spec import RunSpec
from probe.ground.errors import EXIT_NONFINITE
from probe.profiler import mstx

log = logging.getLogger(__name__)

def _with_monitor(callbacks: tuple[CallbackSpec, ...]) -> list[CallbackSpec]:
    """``callbacks`` plus the monitor agent's when ``PROBE_MONITOR=host:port`` is set."""
    from probe.monitor.address import monitor_address
    from probe.monitor.agent.callback import MonitorAgentCallback

    out = list(callbacks)
    if monitor_address() and not any(c.factory is MonitorAgentCallback for c in out):
        out.append(CallbackSpec(MonitorAgentCallback))
    return out


def resolve_device(name: str, rank: int) -> torch.device:
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            from probe.ground.errors import ProbeError
            raise ProbeError(f"device {name!r}: CUDA is not available on this machine; use --device cpu")
        if name == "cuda":
            return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device(name)


def build_rank_model(spec: RunSpec, device: torch.device):
    """The model of ``spec.engine`` with the shared weights, on ``device``; compiled when asked."""
    cfg = get_preset(spec.preset).with_overrides(global_batch=spec.global_batch, seq_len=spec.seq_len)
    model = build_model(spec.engine, cfg)
    state = load_weights_file(spec.weights) if spec.weights else init_reference_state(cfg, spec.seed)
    model.load_reference_state(state)
    model.to(device)
    compiled = False
    want = spec.compile if spec.compile is not None else device.type == "cuda"
    if want and spec.engine == "fused":
        model.compile_blocks()
        compiled = True
    return cfg, model, compiled


def _intra_op_threads(world_size: int) -> int | None:
    """Intra-op threads for one CPU rank: ``OMP_NUM_THREADS`` when set; else, with several
    ranks, the host's cores shared among them (oversubscribed threads spin against each other:
    every step slower); else None (torch's own default).

    Set explicitly even from ``OMP_NUM_THREADS``: a rank's may come from the run's extra
    environment, applied after torch (and its OpenMP runtime, which reads it once) was loaded.
    """
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value.isdigit() and int(value) > 0:
        return int(value)
    return max(1, (os.cpu_count() or 1) // world_size) if world_size > 1 else None


#: ``--dtype`` → the autocast dtype of the forward and the loss (None: no autocast)
DTYPES = {"fp32": None, "bf16": torch.bfloat16}


def check_dtype(name: str) -> None:
    """Raise a ProbeError for a ``--dtype`` the engine does not run."""
    if name not in DTYPES:
        from probe.ground.errors import ProbeError
        raise ProbeError(f"--dtype {name!r}: use one of {', '.join(DTYPES)}")


def run_rank(spec: RunSpec, rank: int, world_size: int) -> dict[str, Any]:
    """Train one rank for ``spec.max_steps`` steps; returns the last step's metrics."""
    dist = torch.distributed
    check_dtype(spec.dtype)
    device = resolve_device(spec.device, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif (threads := _intra_op_threads(world_size)) is not None:
        torch.set_num_threads(threads)
    torch.manual_seed(spec.seed)
    cfg, model, compiled = build_rank_model(spec, device)
    faults = parse_faults(spec.faults)
    check_faults(faults, model, world_size)
    planter = FaultPlanter(faults, rank)
    planter.apply(model)
    fused_opt = spec.engine == "fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01,
                                  fused=fused_opt, foreach=False if not fused_opt else None)
    run_name = os.path.basename(os.path.abspath(spec.out_dir))
    store = StoreWriter(spec.out_dir, rank=rank, run=run_name, fsync=spec.fsync)
    ctx = TrainContext(rank=rank, world_size=world_size, run=run_name, out_dir=spec.out_dir,
                       engine=spec.engine, preset=spec.preset, device=device, model=model,
                       optimizer=optimizer, config=cfg, max_steps=spec.max_steps, store=store,
                       extra={"compiled": compiled, "faults": [str(f) for f in faults],
                              "seed": spec.seed, "dtype": spec.dtype})
    callbacks = CallbackList([c.build() for c in _with_monitor(spec.callbacks)] + [RunConfigCallback()], rank)
    params = [p for p in model.parameters() if p.requires_grad]
    tokens_per_step = (spec.global_batch or cfg.global_batch) // world_size * cfg.seq_len
    progress = None
    if rank == 0 and not spec.quiet:
        from probe.engine.progress import Progress
        progress = Progress(spec.max_steps, f"{spec.engine}/{spec.preset} x{world_size}",
                            every=spec.log_every)
    metrics: dict[str, Any] = {}
    error: BaseException | None = None
    reported = False
    callbacks.call("on_train_start", ctx)
    try:
        for step in range(spec.max_steps):
            planter.step = step
            callbacks.call("on_step_start", ctx, step)
            metrics, health = _train_step(ctx, step, params, planter, tokens_per_step, spec)
            callbacks.call("on_step_end", ctx, step, metrics)
            now = time.time_ns()
            store.write_rows("metric", [
                {"time_ns": now, "job": run_name, "rank": rank, "step": step, "name": k, "value": float(v)}
                for k, v in metrics.items() if isinstance(v, (int, float))])
            store.end_step(step)
            if progress is not None:
                progress.update(step, health.mean_loss, metrics["step_time_ms"])
            if health.problem is not None:
                if rank == 0 and not reported:
                    line = f"probe: {health.problem}; " + (
                        "--allow-nan: training goes on" if spec.allow_nan else
                        f"training stops at this step (exit code {EXIT_NONFINITE}; --allow-nan trains on)")
                    if progress is not None:
                        progress.note(line)
                    else:
                        log.warning(line)
                reported = True
                if not spec.allow_nan:
                    break       # every rank: the problem is read from the all-reduced values
            if ctx.extra.get("stop"):
                if rank == 0:
                    log.warning(f"probe: {ctx.extra['stop']}; training stops at step {step}")
                break           # a callback asked (every rank decides from the same values)
    except BaseException as e:
        error = e
        raise
    finally:
        if progress is not None:
            progress.close()
        callbacks.call("on_train_end", ctx, error)
        planter.remove()
        store.close()
        if dist.is_available() and dist.is_initialized() and error is None:
            dist.barrier()
    return metrics


@dataclass
class StepHealth:
    """What rank 0 shows of a step: the mean loss over the ranks, and what was not finite
    (None when the losses and the gradient norm are)."""

    mean_loss: float
    problem: str | None = None


def _number(v: float) -> str:
    return f"{v:.4f}" if math.isfinite(v) else str(v)


def _health(step: int, losses: list[float], grad_norm: float, bad_grad_ranks: list[int] | None) -> StepHealth:
    """The step's :class:`StepHealth` from every rank's loss and the all-reduced gradient norm.

    >>> _health(3, [2.5, float("nan")], float("nan"), None).problem
    'rank 1 step 3: loss = nan (gradient norm nan)'
    >>> _health(3, [float("inf")], 1.5, None).problem
    'rank 0 step 3: loss = inf'
    >>> _health(2, [2.5, 2.0], float("inf"), [0]).problem
    'rank 0 step 2: gradient norm = inf (loss 2.5000)'
    >>> _health(2, [2.5, 2.0], 1.0, None).problem is None
    True
    """
    finite = [v for v in losses if math.isfinite(v)]
    mean = sum(losses) / len(losses)
    health = StepHealth(mean_loss=mean)
    bad = [r for r, v in enumerate(losses) if not math.isfinite(v)]
    if bad:
        values = sorted({str(losses[r]) for r in bad})
        who = f"rank {bad[0]}" if len(bad) == 1 else f"ranks {','.join(map(str, bad))}"
        health.problem = f"{who} step {step}: loss = {', '.join(values)}"
        if not math.isfinite(grad_norm):
            health.problem += f" (gradient norm {grad_norm})"
    elif not math.isfinite(grad_norm):
        loss = _number(finite[0]) if len(finite) == 1 else f"mean {_number(mean)}"
        if bad_grad_ranks and len(bad_grad_ranks) == 1:
            loss = _number(losses[bad_grad_ranks[0]])
        if bad_grad_ranks:
            who = (f"rank {bad_grad_ranks[0]}" if len(bad_grad_ranks) == 1
                   else f"ranks {','.join(map(str, bad_grad_ranks))}")
            health.problem = f"{who} step {step}: gradient norm = {grad_norm} (loss {loss})"
        else:
            health.problem = (f"step {step}: gradient norm = {grad_norm} after the all-reduce "
                              f"(each rank's own gradients are finite; loss {loss})")
    return health


def _train_step(ctx: TrainContext, step: int, params: list, planter: FaultPlanter,
                tokens_per_step: int, spec: RunSpec) -> dict[str, Any]:
    dist = torch.distributed
    model, optimizer, device = ctx.model, ctx.optimizer, ctx.device
    cuda = device.type == "cuda"
    t0 = time.perf_counter()
    # a CPU rank's compute CPU time too (the whole process's: intra-op threads included): a
    # neighbour taking its core stretches the wall time only, more work stretches both
    cpu = time.process_time if not cuda else None
    step_range = mstx.range_start(f"step {step}", domain="step")
    r = mstx.range_start("fetch", domain="dataloader")
    tokens, targets = make_batch(ctx.config, step, ctx.rank, ctx.world_size, spec.seed, spec.global_batch)
    tokens, targets = tokens.to(device, non_blocking=True), targets.to(device, non_blocking=True)
    mstx.range_end(r, domain="dataloader")
    t1 = time.perf_counter()
    c1 = cpu() if cpu else 0.0
    optimizer.zero_grad(set_to_none=True)
    r = mstx.range_start("forward", domain="engine")
    low = DTYPES[spec.dtype]
    with torch.autocast(device.type, dtype=low) if low is not None else contextlib.nullcontext():
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    mstx.range_end(r, domain="engine")
    r = mstx.range_start("backward", domain="engine")
    loss.backward()
    mstx.range_end(r, domain="engine")
    if cuda:
        torch.cuda.synchronize(device)
    t2 = time.perf_counter()
    # the compute after the all-reduce (optimizer) is slowed at the next step's: all of the
    # step's compute then takes the factor, not the forward and backward alone
    tail_s, tail_cpu_s = planter.tail
    planter.slow_down(t2 - t1 + tail_s, cpu() - c1 + tail_cpu_s if cpu else None)
    planter.hang_before_collective(step)
    t2b = time.perf_counter()
    c2b = cpu() if cpu else 0.0
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    # every rank's loss rides in the gradients' all-reduce (one slot per rank, zero elsewhere):
    # after it, each rank has every loss, so a non-finite one stops all ranks at the same step
    world = ctx.world_size
    slots = torch.zeros(world, dtype=grads[0].dtype, device=device)
    slots[ctx.rank] = loss.detach().to(slots.dtype)
    flat = torch.cat([g.reshape(-1) for g in grads] + [slots])
    n = flat.numel() - world
    if world > 1:
        dist.all_reduce(flat)
        flat[:n].div_(world)
        offset = 0
        for p, g in zip(params, grads):
            size = g.numel()
            p.grad = flat[offset:offset + size].view_as(g)
            offset += size
    if cuda:
        torch.cuda.synchronize(device)
    t3 = time.perf_counter()
    c3 = cpu() if cpu else 0.0
    grad_flat = flat[:n]
    stats = torch.cat([torch.stack([torch.linalg.vector_norm(grad_flat),
                                    (~torch.isfinite(grad_flat)).sum().to(flat.dtype)]), flat[n:]])
    r = mstx.range_start("optimizer", domain="engine")
    optimizer.step()
    mstx.range_end(r, domain="engine")
    loss_value = loss.item()
    grad_norm, nonfinite, *losses = stats.tolist()
    ctx.extra["rank_losses"] = losses       # every rank's loss of this step, for the callbacks
    if math.isinf(grad_norm) and nonfinite == 0:
        grad_norm = norm_in_float64(grad_flat)     # float32's sum of squares overflowed
    bad_grad_ranks = None
    if not math.isfinite(grad_norm) and all(math.isfinite(v) for v in losses):
        bad_grad_ranks = _ranks_with_bad_gradients(grads, ctx.rank, world, device)
    t4 = time.perf_counter()
    c4 = cpu() if cpu else 0.0
    mstx.range_end(step_range, domain="step")
    step_time = t4 - t0
    metrics = {
        "loss": loss_value,
        "step_time_ms": step_time * 1e3,
        "data_time_ms": (t1 - t0) * 1e3,
        "compute_time_ms": ((t2b - t1) + (t4 - t3)) * 1e3,
        "comm_time_ms": (t3 - t2b) * 1e3,
        "tokens": float(tokens_per_step),
        "tokens_per_s": tokens_per_step / step_time if step_time > 0 else 0.0,
        "grad_norm": grad_norm,
        "nonfinite_grads": nonfinite,
        "lr": optimizer.param_groups[0]["lr"],
    }
    if cpu:
        metrics["compute_cpu_ms"] = ((c2b - c1) + (c4 - c3)) * 1e3
    planter.tail = (t4 - t3, c4 - c3)
    return metrics, _health(step, losses, grad_norm, bad_grad_ranks)


def norm_in_float64(x: torch.Tensor) -> float:
    """The L2 norm of ``x`` from :class:`probe.engine_adapter.torch_stats.TorchStats`' statistics,
    whose sum of squares is float64 (the native kernel on the host, float64 chunks on a device):
    for finite gradients past ~1.8e19, whose float32 norm is inf. The step reports the float32
    norm, read with its losses in one transfer, and asks this only then: a finite gradient's
    norm read inf, and the monitor named it a NaN/Inf gradient.

    >>> norm_in_float64(torch.full((100,), 1e20)), float(torch.linalg.vector_norm(torch.full((100,), 1e20)))
    (1.0000000200408773e+21, inf)
    """
    from probe.engine_adapter.base import FLOAT
    from probe.engine_adapter.torch_stats import TorchStats

    stats = TorchStats()
    return math.sqrt(stats.gather([stats.reduce(x.detach().reshape(-1), FLOAT)])[0][3])


def _ranks_with_bad_gradients(grads: list, rank: int, world: int, device: torch.device) -> list[int]:
    """The ranks whose own gradients (before the all-reduce) hold a NaN or Inf.

    Called only on a step whose all-reduced gradient norm is not finite; that norm is the same
    on every rank, so every rank calls it and its one collective is matched.
    """
    mine = any(not bool(torch.isfinite(g).all()) for g in grads)
    if world == 1:
        return [0] if mine else []
    flags = torch.zeros(world, device=device)
    flags[rank] = float(mine)
    torch.distributed.all_reduce(flags)
    return [r for r, v in enumerate(flags.tolist()) if v > 0]
