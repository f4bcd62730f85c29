"""Benchmark: API precision check replay time and overflow-check overhead, side by side with msprobe.

**Replay.** One tensor dump of the bundled engine (``tiny`` preset, ``--level api``, a planted
``perturb:Torch.matmul:1`` fault) is merged into one ``dump.json`` of ``--calls`` forward API
calls that both tools replay (in-place, random and uninitialised calls left out; each step's
call indices offset so names stay unique), every tensor saved as a ``.pt`` file (msprobe's
acc_check reads only ``.pt``/``.npy``; ours reads those and safetensors). Then:

- ours: :func:`probe.checker.offline.check_dump` (float64 golden on the CPU), timed in-process;
- msprobe: its acc_check loop (``run_api_offline``: CPU golden plus the device run) in the
  msprobe environment, timed in-process around ``acc_check``. Its command (``msprobe acc_check``)
  stops at ``torch.cuda.set_device`` on a machine without CUDA or NPU, so the worker sets its
  module's device to ``cpu`` and calls the loop itself: the same replay, both sides on the CPU.

**Overflow check.** Median step time of the ``mini`` preset with no dump, ``probe.dump``
statistics task and overflow task (module and mix level), and msprobe's ``overflow_check`` task
where it runs (this msprobe's PyTorch task for it is ``nan_check``; ``overflow_check`` is
its offline analysis of a dumped step); each mode in its own process.

    python benchmarks/bench_check_api.py [--calls 2000] [--steps 12] [--skip-overflow]
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
sys.path.insert(0, ROOT)
DEFAULT_MSPROBE_PY = os.path.join(ROOT, ".venv-bench", "bin", "python")


# --------------------------------------------------------------------------- the dump
def make_merged_dump(out: str, calls: int, fault: str = "perturb:Torch.matmul:1",
                     keep: set[str] | None = None) -> tuple[str, int]:
    """A one-file dump of at least ``calls`` replayable forward API calls (see the module
    docstring; ``keep``: only these APIs, from one step); returns its dump.json and the number
    of calls."""
    import torch
    from safetensors.torch import load_file

    from probe.checker.apis import skip_reason, split_name

    raw = os.path.join(out, "raw")
    per_step = 350          # replayable forward calls of one step of the tiny preset (at least)
    steps = 1 if keep else max(1, -(-calls // per_step))
    cmd = [sys.executable, "-m", "probe.cli", "dump", "--level", "api", "--task", "tensor",
           "--tensor-format", "safetensors",
           "--steps", f"0-{steps - 1}", "--out", raw, "--fault", fault, "--force"]
    subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
    merged = os.path.join(out, "merged", "step0", "rank0")
    data_dir = os.path.join(merged, "dump_tensor_data")
    os.makedirs(data_dir, exist_ok=True)
    data, construct = {}, {}
    for s in range(steps):
        folder = os.path.join(raw, f"step{s}", "rank0")
        with open(os.path.join(folder, "dump.json")) as f:
            dump = json.load(f)
        for name, entry in dump["data"].items():
            if not name.endswith(".forward"):
                continue
            api, index = split_name(name)
            if index < 0 or skip_reason(api, entry.get("input_kwargs", {}).keys()) is not None:
                continue
            if keep is not None and api not in keep:
                continue
            new = f"{api}.{index + 10000 * s}.forward"

            def move(x):
                if isinstance(x, list):
                    return [move(v) for v in x]
                if isinstance(x, dict) and isinstance(x.get("data_name"), str):
                    t = load_file(os.path.join(folder, "dump_tensor_data", x["data_name"]))["tensor"]
                    file = f"s{s}.{x['data_name'].rsplit('.', 1)[0]}.pt"
                    torch.save(t, os.path.join(data_dir, file))
                    return {**x, "data_name": file}
                if isinstance(x, dict):
                    return {k: move(v) for k, v in x.items()}
                return x
            data[new] = move(entry)
            construct[new] = None
            if len(data) >= calls:
                break
        if len(data) >= calls:
            break
    doc = {"task": "tensor", "level": "L1", "framework": "pytorch", "dump_data_dir": data_dir, "data": data}
    with open(os.path.join(merged, "dump.json"), "w") as f:
        json.dump(doc, f)
    with open(os.path.join(merged, "construct.json"), "w") as f:
        json.dump(construct, f)
    return os.path.join(merged, "dump.json"), len(data)


def run_ours(dump_json: str) -> dict:
    from probe.checker.offline import check_dump

    t0 = time.perf_counter()
    rows, summary = check_dump(os.path.dirname(dump_json), golden="cpu-fp64")
    seconds = time.perf_counter() - t0
    failing = sorted(r["name"] for r in rows if r["verdict"] in ("error", "nan"))
    return {"seconds": seconds, "calls": len(rows), "counts": summary["counts"], "failing": failing,
            "first": (summary["first_failure"] or {}).get("name")}


def msprobe_worker(dump_json: str, out: str) -> dict:
    """Run msprobe's acc_check loop on the CPU (see the module docstring); in msprobe's venv."""
    import csv

    from msprobe.pytorch.api_accuracy_checker.acc_check import acc_check as ac
    from msprobe.pytorch.api_accuracy_checker.acc_check import acc_check_utils as au
    from msprobe.pytorch.api_accuracy_checker.common.config import CheckerConfig
    from msprobe.pytorch.common.parse_json import parse_json_info_forward_backward

    ac.current_device = au.current_device = "cpu"
    forward, backward, _ = parse_json_info_forward_backward(dump_json)
    real = os.path.join(os.path.dirname(dump_json), "dump_tensor_data")
    result = os.path.join(out, "result.csv")
    cfg = CheckerConfig().get_acc_check_config(
        forward_content=forward, backward_content=backward, result_csv_path=result,
        details_csv_path=os.path.join(out, "details.csv"), save_error_data=False,
        is_continue_acc_check=False, real_data_path=real, error_data_path=out)
    t0 = time.perf_counter()
    ac.acc_check(cfg)
    seconds = time.perf_counter() - t0
    rows = list(csv.reader(open(result)))
    header, body = rows[0], rows[1:]
    fwd = header.index("Forward Test Success") if "Forward Test Success" in header else 1
    verdicts = {r[0]: r[fwd] for r in body if r}
    failing = sorted(n for n, v in verdicts.items() if v.lower() in ("error", "false", "fail"))
    skipped = sum(1 for v in verdicts.values() if v.lower() == "skip")
    return {"seconds": seconds, "calls": len(forward), "verdicts": dict(sorted(
        {v: list(verdicts.values()).count(v) for v in set(verdicts.values())}.items())),
            "failing": failing, "skipped": skipped}


def run_msprobe(python: str, dump_json: str, timeout: int = 3600) -> dict | None:
    out = tempfile.mkdtemp(prefix="bench-msprobe-acc-")
    proc = subprocess.run([python, os.path.abspath(__file__), "--msprobe-worker", dump_json, out],
                          capture_output=True, text=True, cwd=out, timeout=timeout,
                          env=dict(os.environ, PYTHONWARNINGS="ignore"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        print(f"  msprobe acc_check: failed ({' | '.join(tail)})")
        return None
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- overflow overhead
def overflow_mode(mode: str, steps: int, warmup: int, preset: str, threads: int) -> dict:
    """Per-step times of one mode (in this process)."""
    import torch

    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from bench_dump import _one_step, _train_setup

    torch.set_num_threads(threads)
    model, opt, batches = _train_setup(preset)
    out = tempfile.mkdtemp(prefix=f"bench-{mode}-")
    after_step, stop = (lambda: None), (lambda: None)
    if mode.startswith("ours-"):
        from probe.dumper.session import DumpSession
        _, task, level = mode.split("-")
        session = DumpSession(model, out=out, level=level, task=task, auto_step=False, quiet=True)
        session.start()
        after_step, stop = session.step, session.stop
    elif mode.startswith("msprobe-"):
        from msprobe.pytorch import PrecisionDebugger
        level = {"msprobe-overflow-module": "L0", "msprobe-overflow-mix": "mix"}[mode]
        cfg = {"task": "nan_check", "dump_path": out, "rank": [], "step": [], "level": level,
               "nan_check": {}}
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
    written = sum(len(files) for _, _, files in os.walk(out))
    shutil.rmtree(out, ignore_errors=True)
    return {"mode": mode, "times_ms": times, "cpu_ms": cpu, "files": written}


def _spawn_mode(python: str, mode: str, args) -> dict | None:
    cmd = [python, os.path.abspath(__file__), "--run-mode", mode, "--steps", str(args.steps),
           "--preset", args.preset, "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1800,
                          env=dict(os.environ, PYTHONPATH=ROOT, PYTHONWARNINGS="ignore"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
        print(f"  {mode}: failed ({' | '.join(tail)})")
        return None
    return json.loads(lines[-1])


def _msprobe_available(python: str) -> bool:
    if not os.path.exists(python):
        return False
    return subprocess.run([python, "-c", "import torch, msprobe.pytorch"], capture_output=True).returncode == 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--preset", default="mini")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--msprobe-python", default=DEFAULT_MSPROBE_PY)
    ap.add_argument("--skip-overflow", action="store_true")
    ap.add_argument("--skip-replay", action="store_true")
    ap.add_argument("--run-mode", help=argparse.SUPPRESS)
    ap.add_argument("--msprobe-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.msprobe_worker:
        print(json.dumps(msprobe_worker(*args.msprobe_worker)))
        return 0
    if args.run_mode:
        print(json.dumps(overflow_mode(args.run_mode, args.steps, 2, args.preset, args.threads)))
        return 0
    have_msprobe = _msprobe_available(args.msprobe_python)
    ok = True
    if not args.skip_replay:
        work = tempfile.mkdtemp(prefix="bench-check-api-")
        dump_json, n = make_merged_dump(work, args.calls)
        print(f"replay: {n} recorded forward API calls (tiny preset, planted perturb:Torch.matmul:1)")
        ours = run_ours(dump_json)
        print(f"  ours    : {ours['seconds']:7.2f} s  ({ours['seconds'] / n * 1e3:.2f} ms/call); "
              f"{ours['counts']}; failing: {ours['failing']}")
        if have_msprobe:
            theirs = run_msprobe(args.msprobe_python, dump_json)
            if theirs is not None:
                ratio = ours["seconds"] / theirs["seconds"]
                ok = ratio < 1 / 3
                print(f"  msprobe : {theirs['seconds']:7.2f} s  ({theirs['seconds'] / n * 1e3:.2f} ms/call); "
                      f"forward verdicts {theirs['verdicts']}; failing: {theirs['failing']}")
                print(f"  ratio ours/msprobe = {ratio:.3f} ({'meets' if ok else 'misses'} the 1/3 target); "
                      f"planted fault found by ours: {ours['first']}; by msprobe: "
                      f"{[f for f in theirs['failing'] if 'matmul' in f] or 'none'}")
        else:
            print(f"  msprobe: skipped ({args.msprobe_python} cannot import msprobe.pytorch)")
        shutil.rmtree(work, ignore_errors=True)
    if not args.skip_overflow:
        plan = [(sys.executable, m) for m in ("baseline", "ours-statistics-module", "ours-overflow-module",
                                              "ours-statistics-mix", "ours-overflow-mix")]
        if have_msprobe:
            plan += [(args.msprobe_python, m) for m in ("baseline", "msprobe-overflow-module",
                                                        "msprobe-overflow-mix")]
        got: dict[tuple[str, str], dict[str, list[float]]] = {}
        files: dict[tuple[str, str], int] = {}
        for _ in range(args.rounds):                 # modes interleaved, so load drifts hit all alike
            for python, mode in plan:
                r = _spawn_mode(python, mode, args)
                if r is not None:
                    g = got.setdefault((python, mode), {"wall": [], "cpu": []})
                    g["wall"] += r["times_ms"]
                    g["cpu"] += r["cpu_ms"]
                    files[(python, mode)] = r["files"]
        med = {k: {m: statistics.median(v) for m, v in g.items()} for k, g in got.items()}
        print(f"\noverflow check, {args.preset} preset, {args.threads} threads, {args.steps} steps x "
              f"{args.rounds} rounds: median step (ms) wall / process CPU, added over its environment's baseline")
        for (python, mode), m in med.items():
            base = med.get((python, "baseline"), m)
            env = "msprobe venv" if python == args.msprobe_python else "main venv"
            print(f"  {mode:<24} {m['wall']:8.1f} / {m['cpu']:8.1f}   +{m['wall'] - base['wall']:7.1f} / "
                  f"+{m['cpu'] - base['cpu']:7.1f}   files written {files[(python, mode)]:5d}  ({env})")
        for level in ("module", "mix"):
            over, stats = med.get((sys.executable, f"ours-overflow-{level}")), med.get((sys.executable, f"ours-statistics-{level}"))
            base = med.get((sys.executable, "baseline"))
            if None in (over, stats, base):
                continue
            for measure in ("wall", "cpu"):
                added_over, added_stats = over[measure] - base[measure], stats[measure] - base[measure]
                within = added_over <= added_stats * 1.05
                ok = ok and (within or measure == "wall")
                print(f"  {level} ({measure}): overflow adds {added_over:.1f} ms/step, statistics "
                      f"{added_stats:.1f} ({'within' if within else 'over'} the statistics task's budget)")
            ms = med.get((args.msprobe_python, f"msprobe-overflow-{level}"))
            ms_base = med.get((args.msprobe_python, "baseline"))
            if ms is not None and ms_base is not None:
                print(f"  {level}: msprobe overflow_check adds {ms['wall'] - ms_base['wall']:.1f} ms/step wall")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
