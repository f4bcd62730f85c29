"""Launch the bundled engine: one rank in-process, or N ranks as spawned ``torch.distributed``
processes (gloo on CPU, nccl on CUDA), data parallel with gradients all-reduced.

>>> from engine.spec import RunSpec
>>> result = run_training(RunSpec(preset="tiny", max_steps=2, out_dir=__import__("tempfile").mkdtemp(),
...                               quiet=True))
>>> len(result.steps)
2
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from collectors.store import STORE_DIRNAME
from engine.spec import RunSpec
from ground.errors import ProbeError

MAX_PROCS = 64


@dataclass
class RunResult:
    """What a finished run left: its directory and the per-step table (from its store)."""

    out_dir: str
    nproc: int
    steps: list[dict[str, Any]] = field(default_factory=list)  # step, loss, step_time_ms, tokens_per_s

    @property
    def final_loss(self) -> float | None:
        return self.steps[-1]["loss"] if self.steps else None


def validate(spec: RunSpec) -> None:
    """Check the spec before any process starts; a ProbeError names the bad value."""
    from engine.config import get_preset
    from engine.faults import parse_faults
    from engine.models import ENGINES

    if spec.engine not in ENGINES:
        raise ProbeError(f"unknown engine {spec.engine!r}; valid engines: {', '.join(ENGINES)}")
    cfg = get_preset(spec.preset)
    if not 1 <= spec.nproc <= MAX_PROCS:
        raise ProbeError(f"bad rank count --nproc {spec.nproc}; use 1..{MAX_PROCS}")
    if spec.max_steps < 1:
        raise ProbeError(f"bad --max-steps {spec.max_steps}; use 1 or more")
    batch = spec.global_batch or cfg.global_batch
    if batch % spec.nproc:
        raise ProbeError(f"--nproc {spec.nproc} does not divide the global batch {batch} of preset "
                         f"{spec.preset!r}; use a divisor of {batch}")
    faults = parse_faults(spec.faults)
    for f in faults:
        if f.kind == "slow" and int(f.target) >= spec.nproc:
            raise ProbeError(f"fault {f}: rank {f.target} does not exist with --nproc {spec.nproc}")
    if os.path.exists(spec.out_dir) and not os.path.isdir(spec.out_dir):
        raise ProbeError(f"{spec.out_dir}: exists and is not a directory; choose another --out")


def run_training(spec: RunSpec) -> RunResult:
    """Run ``spec`` to completion and return the per-step table read back from the store.

    A run directory holds one run: the records of an earlier run in it are replaced.
    """
    validate(spec)
    try:
        os.makedirs(spec.out_dir, exist_ok=True)
        shutil.rmtree(os.path.join(spec.out_dir, STORE_DIRNAME), ignore_errors=True)
    except OSError as e:
        raise ProbeError(f"{spec.out_dir}: cannot create the run directory ({e.strerror})") from None
    if spec.nproc == 1:
        from engine.train import run_rank
        run_rank(spec, 0, 1)
    else:
        _spawn(spec)
    return RunResult(out_dir=spec.out_dir, nproc=spec.nproc, steps=step_table(spec.out_dir))


def step_table(out_dir: str) -> list[dict[str, Any]]:
    """Per-step rows over all ranks: mean loss, slowest rank's step time, summed tokens/s."""
    from collectors.store import open_store

    con = open_store(out_dir)
    rows = con.sql("""
        SELECT step, avg(loss) AS loss, max(step_time_ms) AS step_time_ms,
               sum(tokens_per_s) AS tokens_per_s, arg_max(rank, step_time_ms) AS slowest_rank,
               count(*) AS ranks
        FROM steps GROUP BY step ORDER BY step""").fetchall()
    cols = ["step", "loss", "step_time_ms", "tokens_per_s", "slowest_rank", "ranks"]
    return [dict(zip(cols, r)) for r in rows]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(spec: RunSpec) -> None:
    import torch.multiprocessing as mp

    port = _free_port()
    try:
        mp.start_processes(_worker, args=(spec, port), nprocs=spec.nproc, join=True,
                           start_method="spawn")
    except mp.ProcessExitedException as e:
        raise ProbeError(f"rank {e.error_index} exited with code {e.exit_code}; the other ranks "
                         "were stopped (see its message above)", exit_code=1) from None
    except mp.ProcessRaisedException as e:
        last = [ln for ln in str(e).strip().splitlines() if ln.strip()][-1]
        raise ProbeError(f"rank {e.error_index} failed: {last}", exit_code=1) from None


def _worker(rank: int, spec: RunSpec, port: int) -> None:
    import torch.distributed as dist

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(spec.nproc), "LOCAL_RANK": str(rank)})
    os.environ.update(dict(spec.extra_env))
    backend = "nccl" if spec.device.startswith("cuda") else "gloo"
    try:
        dist.init_process_group(backend, rank=rank, world_size=spec.nproc,
                                timeout=timedelta(seconds=120))
        from engine.train import run_rank
        run_rank(spec, rank, spec.nproc)
    except ProbeError as e:
        print(f"probe: rank {rank}: error: {e}", file=sys.stderr, flush=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - one line per rank, never a traceback
        if os.environ.get("PROBE_DEBUG"):
            raise
        print(f"probe: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
