"""Launch the bundled engine: one rank in-process, or N ranks as spawned ``torch.distributed``
processes (gloo on CPU, nccl on CUDA), data parallel with gradients all-reduced.

>>> from probe.engine.spec import RunSpec
>>> result = run_training(RunSpec(preset="tiny", max_steps=2, out_dir=__import__("tempfile").mkdtemp(),
...                               quiet=True))
>>> len(result.steps)
2
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from probe.collectors.store import STORE_DIRNAME
from probe.engine.spec import RunSpec
from probe.engine_adapter.config_format import CONFIG_DIRNAME
from probe.ground.errors import ProbeError
from probe.ground.outdir import claim

log = logging.getLogger(__name__)

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

    @property
    def first_nonfinite(self) -> dict[str, Any] | None:
        """The first step whose loss (any rank's) or gradient norm is NaN/Inf, or None."""
        import math

        for row in self.steps:
            if any(v is not None and not math.isfinite(v) for v in (row["loss"], row.get("grad_norm"))):
                return row
        return None

    def check_finite(self, allow_nan: bool) -> None:
        """Raise the one-line error of a run whose loss turned NaN/Inf (exit code
        :data:`~probe.ground.errors.EXIT_NONFINITE`), unless ``allow_nan``."""
        from probe.ground.errors import EXIT_NONFINITE

        row = self.first_nonfinite
        if row is None or allow_nan:
            return
        raise ProbeError(f"the loss or gradient norm is not finite at step {row['step']} (loss "
                         f"{row['loss']}, gradient norm {row.get('grad_norm')}); training stopped "
                         "there, its records are written; --allow-nan trains on",
                         exit_code=EXIT_NONFINITE)


def validate(spec: RunSpec) -> None:
    """Check the spec before any process starts; a ProbeError names the bad value."""
    from probe.engine.config import get_preset
    from probe.engine.faults import parse_faults
    from probe.engine.models import ENGINES

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
        if f.rank is not None and f.rank >= spec.nproc:
            raise ProbeError(f"fault {f}: rank {f.rank} does not exist with --nproc {spec.nproc}")
    if os.path.exists(spec.out_dir) and not os.path.isdir(spec.out_dir):
        raise ProbeError(f"{spec.out_dir}: exists and is not a directory; choose another --out")


def run_training(spec: RunSpec) -> RunResult:
    """Run ``spec`` to completion and return the per-step table read back from the store.

    The run directory is claimed for ``spec.owner`` (see :mod:`probe.ground.outdir`): a store that
    verb wrote before is replaced, anything else there stops the run unless ``spec.force``.
    """
    validate(spec)
    claim(spec.out_dir, spec.owner, [STORE_DIRNAME, CONFIG_DIRNAME], force=spec.force)
    if spec.nproc == 1:
        from probe.engine.train import run_rank
        run_rank(spec, 0, 1)
    else:
        _spawn(spec)
    return RunResult(out_dir=spec.out_dir, nproc=spec.nproc, steps=step_table(spec.out_dir))


def step_table(out_dir: str) -> list[dict[str, Any]]:
    """Per-step rows over all ranks: mean loss, the step time, summed tokens/s, and the slowest
    rank by its own work (compute time, not the step time: in a synchronous job every rank's
    step lasts as long as the slowest one's, so step time cannot tell them apart)."""
    from probe.collectors.store import open_store

    con = open_store(out_dir)
    rows = con.sql("""
        SELECT step, avg(loss) AS loss, max(step_time_ms) AS step_time_ms,
               sum(tokens_per_s) AS tokens_per_s,
               arg_max(rank, coalesce(compute_time_ms, step_time_ms)) AS slowest_rank,
               max(coalesce(compute_time_ms, step_time_ms)) AS slowest_compute_ms,
               count(*) AS ranks, max(grad_norm) AS grad_norm
        FROM steps GROUP BY step ORDER BY step""").fetchall()
    cols = ["step", "loss", "step_time_ms", "tokens_per_s", "slowest_rank", "slowest_compute_ms",
            "ranks", "grad_norm"]
    return [dict(zip(cols, r)) for r in rows]


def rank_table(out_dir: str) -> list[dict[str, Any]]:
    """Per-rank own work over the run: mean compute, communication and step time, slowest first.

    The rank whose compute is far above its peers' is the straggler; its peers show the wait for
    it as communication time.
    """
    from probe.collectors.store import open_store

    rows = open_store(out_dir).sql("""
        SELECT rank, avg(coalesce(compute_time_ms, step_time_ms)) AS compute_ms,
               avg(comm_time_ms) AS comm_ms, avg(step_time_ms) AS step_ms, count(*) AS steps
        FROM steps GROUP BY rank ORDER BY compute_ms DESC""").fetchall()
    return [dict(zip(["rank", "compute_ms", "comm_ms", "step_ms", "steps"], r)) for r in rows]


#: The query that names the straggler: each rank's own compute, slowest first.
STRAGGLER_QUERY = ("select rank, round(avg(compute_time_ms), 2) as compute_ms, "
                   "round(avg(comm_time_ms), 2) as comm_ms from steps group by rank order by compute_ms desc")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: seconds the ranks get to stop after SIGTERM before they are killed
STOP_GRACE_S = 5.0


def _spawn(spec: RunSpec) -> None:
    """Start ``spec.nproc`` ranks and wait for them; the ranks never outlive this process.

    A rank that fails stops the others (torch's process context). SIGINT or SIGTERM to the
    launcher stops every rank (SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`); a launcher
    killed outright (``kill -9``, the OOM killer) is noticed by each rank (parent-death signal,
    and a watchdog on the launcher's pid) and the rank exits.
    """
    import torch.multiprocessing as mp

    import threading

    port = _free_port()
    main = threading.current_thread() is threading.main_thread()    # signals go to the main thread
    previous = signal.signal(signal.SIGTERM, _raise_interrupt) if main else None
    context = None
    try:
        context = mp.start_processes(_worker, args=(spec, port, os.getpid()), nprocs=spec.nproc,
                                     join=False, start_method="spawn")
        while not context.join():
            pass
    except mp.ProcessExitedException as e:
        # a rank's one-line error (exit 2: a bad input, a full disk) is the command's: its code
        # is kept, so a multi-rank run ends as a single process does
        raise ProbeError(f"rank {e.error_index} exited with code {e.exit_code}; the other ranks "
                         "were stopped (see its message above)",
                         exit_code=2 if e.exit_code == 2 else 1) from None
    except mp.ProcessRaisedException as e:
        last = [ln for ln in str(e).strip().splitlines() if ln.strip()][-1]
        raise ProbeError(f"rank {e.error_index} failed: {last}", exit_code=1) from None
    finally:
        if context is not None:
            _stop_ranks(context.processes)
        if main:
            signal.signal(signal.SIGTERM, previous)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop_ranks(processes: list) -> None:
    """SIGTERM every rank still alive, wait up to STOP_GRACE_S, then SIGKILL what is left."""
    import time

    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + STOP_GRACE_S
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join(1.0)


def _die_with(launcher_pid: int) -> None:
    """Make this rank exit when the launcher dies, however it dies.

    Linux delivers SIGKILL on the parent's death (``PR_SET_PDEATHSIG``); a daemon thread also
    polls the parent pid (other systems, and a launcher that died before the signal was set).
    """
    import threading
    import time

    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)      # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while True:
            if os.getppid() != launcher_pid:
                os._exit(1)
            time.sleep(0.5)

    if os.getppid() != launcher_pid:
        os._exit(1)
    threading.Thread(target=watch, name="probe-launcher-watchdog", daemon=True).start()


#: how long ranks wait for each other (rendezvous and each collective)
RENDEZVOUS_TIMEOUT = timedelta(seconds=120)


def _rendezvous_store(rank: int, world_size: int, port: int, timeout: timedelta) -> Any:
    """The ranks' rendezvous store, served by rank 0 on ``MASTER_ADDR:port``.

    torch's own ``env://`` store listens on every interface whatever ``MASTER_ADDR`` says; here
    rank 0 hands it a socket bound to ``MASTER_ADDR`` (127.0.0.1 unless the run's environment
    names another address), so a loopback rendezvous is reachable from this machine alone.
    """
    import torch.distributed as dist

    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    if rank != 0:
        return dist.TCPStore(host, port, world_size, False, timeout=timeout)
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(max(world_size, 16))
    except OSError as e:
        listener.close()
        raise ProbeError(f"rendezvous on {host}:{port}: cannot listen ({e.strerror})") from None
    return dist.TCPStore(host, port, world_size, True, timeout=timeout, wait_for_workers=False,
                         master_listen_fd=listener.detach(), use_libuv=True)   # the store owns it now


def _worker(rank: int, spec: RunSpec, port: int, launcher_pid: int) -> None:
    import torch.distributed as dist

    from probe.ground.logs import print_to_stderr

    print_to_stderr()              # a rank is the launcher's own process: its messages on stderr
    _die_with(launcher_pid)
    signal.signal(signal.SIGTERM, _raise_interrupt)

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": str(rank), "WORLD_SIZE": str(spec.nproc), "LOCAL_RANK": str(rank)})
    os.environ.update(dict(spec.extra_env))
    backend = "nccl" if spec.device.startswith("cuda") else "gloo"
    try:
        dist.init_process_group(backend, rank=rank, world_size=spec.nproc,
                                store=_rendezvous_store(rank, spec.nproc, port, RENDEZVOUS_TIMEOUT),
                                timeout=RENDEZVOUS_TIMEOUT)
        from probe.engine.train import run_rank
        run_rank(spec, rank, spec.nproc)
        from probe.dumper.callback import take_disk_full
        full = take_disk_full()        # this rank's dump met a full disk: it ends as one rank does
        if full is not None:
            raise full
    except ProbeError as e:
        log.error(f"probe: rank {rank}: error: {e}")
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # noqa: BLE001 - one line per rank, never a traceback
        if os.environ.get("PROBE_DEBUG"):
            raise
        log.error(f"probe: rank {rank}: {type(e).__name__}: {e}")
        sys.exit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
