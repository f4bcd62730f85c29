"""The flight recorder's cost: a training step with the ring, side by side with none.

The bundled engine's ``small`` preset (27M parameters) on the CPU, one rank, its own training
step (forward, cross-entropy, backward, AdamW) timed whole. The ring
(:class:`probe.dumper.flight_ring.FlightRing`, the same hooks as ``--flight-recorder K``) is
attached for a block of steps and detached for the next, in rounds ``none, module, none, module+cpp, none, mix``,
so the drift of a shared machine hits every side alike (``module+cpp``: the module level with
its gradients read by the dump's C++ backward capture instead, ``native_grads=True``). Printed per side: the median step (wall
and process CPU), the overhead over the median of the ``none`` blocks, the cost per recorded
module (and per slot) per step in microseconds, and the ring's memory for K steps.

    python benchmarks/bench_flight.py --rounds 4 --block 3 --ring 8
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: the sides: no recorder; the ring at module level with its gradients through the Python hooks
#: (``native_grads=False``); the same with the gradients read by the dump's C++ backward capture
#: (the default); mix level (the default)
SIDES = ("none", "module", "module+cpp", "mix")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--block", type=int, default=3, help="steps per side per round")
    ap.add_argument("--ring", type=int, default=8, help="K, the steps the ring keeps")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from probe.dumper.flight_ring import SLOT_BYTES, FlightRing
    from probe.engine.config import get_preset
    from probe.engine.data import make_batch
    from probe.engine.models import build_model, init_reference_state
    from probe.engine_adapter.base import get_adapter

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = get_preset(args.preset)
    model = build_model("reference", cfg)
    model.load_reference_state(init_reference_state(cfg, 0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    counter = [0]

    def train_step() -> tuple[float, float]:
        step = counter[0]
        counter[0] += 1
        tokens, targets = make_batch(cfg, step, 0, 1, 0, None)
        w, c = time.perf_counter(), time.process_time()
        if ring is not None:
            ring.begin_step(step)
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        loss.backward()
        opt.step()
        loss.item()
        if ring is not None:
            ring.end_step()
        return time.perf_counter() - w, time.process_time() - c

    rings = {side: FlightRing(get_adapter("torch"), args.ring, side.split("+")[0],
                              native_grads=side != "module")
             for side in SIDES[1:]}
    ring = None
    for _ in range(2):                       # warm-up: allocator, kernels, the rings' slots
        train_step()
    for side in rings:
        ring = rings[side]
        ring.attach(model)
        train_step()
        ring.detach()
    ring = None
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    for r in range(args.rounds):
        for side in ("none", "module", "none", "module+cpp", "none", "mix"):
            ring = rings.get(side)
            if ring is not None:
                ring.attach(model)
            for _ in range(args.block):
                times[side].append(train_step())
            if ring is not None:
                ring.detach()
            ring = None
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)

    def med(side: str, i: int) -> float:
        return statistics.median(t[i] for t in times[side])

    base_w, base_c = med("none", 0), med("none", 1)
    modules = sum(1 for n, _ in model.named_modules() if n)
    print(f"preset {args.preset}: {modules} modules, {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M "
          f"parameters, torch threads {torch.get_num_threads()}, {args.rounds} rounds x {args.block} steps a side")
    print(f"{'side':<8} {'step ms':>9} {'cpu ms':>9} {'overhead':>9} {'cpu ovh':>8} {'us/module':>10} "
          f"{'slots':>6} {'us/slot':>8} {'ring KiB':>9} {'B/module/step':>14}")
    for side in SIDES:
        w, c = med(side, 0), med(side, 1)
        ring_ = rings.get(side)
        if ring_ is None:
            print(f"{side:<8} {w * 1e3:>9.1f} {c * 1e3:>9.1f}")
            continue
        slots = ring_.n_slots
        per_module = (w - base_w) / modules * 1e6
        print(f"{side:<8} {w * 1e3:>9.1f} {c * 1e3:>9.1f} {100 * (w / base_w - 1):>8.2f}% "
              f"{100 * (c / base_c - 1):>7.2f}% {per_module:>10.1f} {slots:>6} "
              f"{(w - base_w) / max(slots, 1) * 1e6:>8.2f} {ring_.nbytes / 1024:>9.0f} "
              f"{slots * SLOT_BYTES / modules:>14.0f}")
    print(f"(ring: K={args.ring} steps x capacity slots x {SLOT_BYTES} B + 1 B; B/module/step is "
          f"the bytes one step of one module's slots takes)")
    import tempfile

    from probe.collectors.store import StoreWriter
    from probe.compare.origin import find_origin
    from probe.dumper.flight_write import write_ring

    for side in ("module+cpp", "mix"):
        with tempfile.TemporaryDirectory() as out:
            store = StoreWriter(out, rank=0, run="bench", fsync="never")
            w = time.perf_counter()
            steps = write_ring(rings[side], out, rank=0, run="bench", trigger="request",
                               reason="bench", store=store)
            store.close()
            written = time.perf_counter() - w
            o = time.perf_counter()
            find_origin(out)
            print(f"{side}: the ring of {len(steps)} steps written as a dump (msprobe files and "
                  f"store) in {written * 1e3:.0f} ms; probe origin over it in "
                  f"{(time.perf_counter() - o) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
