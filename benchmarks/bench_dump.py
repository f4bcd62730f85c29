"""Benchmark: the dump's added time per training step, side by side with msprobe.

Runs the bundled engine's ``mini`` preset (2.1M parameters, the shape of msprobe's TinyLlama
benchmark: batch 4 x 64 tokens, AdamW) for a few steps in each mode, each mode in its own
process so no hook state leaks between them:

- ``baseline``: no dump;
- ``ours-module`` / ``ours-mix``: ``probe.dump`` (statistics task, msprobe JSON + Arrow store);
- ``msprobe-L0`` / ``msprobe-mix``: mindstudio-probe's ``PrecisionDebugger`` (statistics task),
  run with the Python of a virtual environment that has msprobe (``--msprobe-python``,
  default ``.venv-bench/bin/python``), with its own baseline measured in that environment.

Prints the median step time of each mode, the added time per step, and the ratio of our
added time to msprobe's at module and at mix level (target: <= 0.2). msprobe is skipped
cleanly when its environment is absent.

    python benchmarks/bench_dump.py [--steps 20] [--threads 2] [--msprobe-python PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_MSPROBE_PY = os.path.join(ROOT, ".venv-bench", "bin", "python")


def _train_setup(preset: str):
    import torch

    from engine.config import get_preset
    from engine.data import make_batch
    from engine.models import build_model, init_reference_state

    torch.manual_seed(0)
    cfg = get_preset(preset)
    model = build_model("reference", cfg)
    model.load_reference_state(init_reference_state(cfg, 0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    batches = [make_batch(cfg, s, 0, 1, 0, None) for s in range(4)]
    return model, opt, batches


def _one_step(model, opt, batch) -> None:
    import torch.nn.functional as F

    tokens, targets = batch
    opt.zero_grad(set_to_none=True)
    logits = model(tokens)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
    loss.backward()
    opt.step()


def run_mode(mode: str, steps: int, warmup: int, preset: str, threads: int) -> dict:
    """Run one mode in this process; returns per-step times in ms."""
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, ROOT)
    model, opt, batches = _train_setup(preset)
    out = tempfile.mkdtemp(prefix=f"bench-{mode}-")
    after_step = lambda: None  # noqa: E731
    stop = lambda: None  # noqa: E731
    if mode.startswith("ours-"):
        from probe.session import DumpSession
        session = DumpSession(model, out=out, level=mode.split("-", 1)[1], task="statistics",
                              auto_step=False, quiet=True)
        session.start()
        after_step, stop = session.step, session.stop
    elif mode.startswith("msprobe-"):
        from msprobe.pytorch import PrecisionDebugger
        level = {"msprobe-L0": "L0", "msprobe-mix": "mix"}[mode]
        cfg = {"task": "statistics", "dump_path": out, "rank": [], "step": [], "level": level,
               "statistics": {"scope": [], "list": [], "data_mode": ["all"], "summary_mode": "statistics"}}
        cfg_path = os.path.join(out, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        debugger = PrecisionDebugger(config_path=cfg_path)
        debugger.start(model)

        def after_step() -> None:
            debugger.stop()
            debugger.step()
            debugger.start(model)
        stop = debugger.stop
    times, cpu = [], []
    for i in range(warmup + steps):
        t0, c0 = time.perf_counter(), time.process_time()
        _one_step(model, opt, batches[i % len(batches)])
        after_step()
        if i >= warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.process_time() - c0) * 1e3)
    stop()
    shutil.rmtree(out, ignore_errors=True)     # the dumps themselves are not looked at
    return {"mode": mode, "times_ms": times, "cpu_ms": cpu}


def _spawn(python: str, mode: str, args) -> dict | None:
    cmd = [python, os.path.abspath(__file__), "--run-mode", mode, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--preset", args.preset, "--threads", str(args.threads)]
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        print(f"  {mode}: failed ({' | '.join(tail)})")
        return None
    return json.loads(lines[-1])


def _msprobe_available(python: str) -> bool:
    if not os.path.exists(python):
        return False
    probe = subprocess.run([python, "-c", "import torch, msprobe.pytorch"], capture_output=True)
    return probe.returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--msprobe-python", default=DEFAULT_MSPROBE_PY)
    ap.add_argument("--rounds", type=int, default=2, help="repeat every mode, keep the best median")
    ap.add_argument("--run-mode", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.run_mode:
        print(json.dumps(run_mode(args.run_mode, args.steps, args.warmup, args.preset, args.threads)))
        return 0

    have_msprobe = _msprobe_available(args.msprobe_python)
    plan = [(sys.executable, m) for m in ("baseline", "ours-module", "ours-mix")]
    if have_msprobe:
        plan += [(args.msprobe_python, m) for m in ("baseline", "msprobe-L0", "msprobe-mix")]
    else:
        print(f"msprobe: skipped ({args.msprobe_python} cannot import torch and msprobe.pytorch; "
              "create it with: python3.11 -m venv .venv-bench && .venv-bench/bin/pip install "
              "torch==2.13.0 mindstudio-probe)")
    samples: dict[tuple[str, str], dict[str, list[float]]] = {}
    for _ in range(args.rounds):                 # modes interleaved, so load drifts hit all alike
        for python, mode in plan:
            r = _spawn(python, mode, args)
            if r is not None:
                got = samples.setdefault((python, mode), {"wall": [], "cpu": []})
                got["wall"] += r["times_ms"]
                got["cpu"] += r["cpu_ms"]
    # the lower quartile of the per-step times: other processes only ever add time
    est = {key: {k: statistics.quantiles(v, n=4)[0] if len(v) > 1 else v[0] for k, v in got.items()}
           for key, got in samples.items()}
    print(f"\npreset {args.preset}, {args.threads} threads, {args.steps} steps x {args.rounds} rounds; "
          "lower quartile per step (ms): wall, process CPU")
    for (python, mode), e in est.items():
        env = "msprobe venv" if python == args.msprobe_python and python != sys.executable else "main venv"
        print(f"  {mode:<12} {e['wall']:8.2f} {e['cpu']:8.2f}   ({env})")
    ok = True
    for ours_mode, ms_mode in (("ours-module", "msprobe-L0"), ("ours-mix", "msprobe-mix")):
        for measure in ("wall", "cpu"):
            ours, base = est.get((sys.executable, ours_mode)), est.get((sys.executable, "baseline"))
            if ours is None or base is None:
                continue
            added = ours[measure] - base[measure]
            line = f"{ours_mode} ({measure}): +{added:.2f} ms/step"
            theirs, base_ms = est.get((args.msprobe_python, ms_mode)), est.get((args.msprobe_python, "baseline"))
            if theirs is not None and base_ms is not None:
                added_ms = theirs[measure] - base_ms[measure]
                ratio = added / added_ms if added_ms > 0 else float("inf")
                if measure == "wall":
                    ok = ok and ratio <= 0.2
                line += (f"; {ms_mode}: +{added_ms:.2f} ms/step; ratio ours/msprobe = {ratio:.3f} "
                         f"({'meets' if ratio <= 0.2 else 'misses'} the 0.2 target)")
            print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
