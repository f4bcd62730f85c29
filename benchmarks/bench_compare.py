"""Benchmark ``probe compare`` against msprobe's compare and against a bare JSON parse.

Generates synthetic dump pairs in msprobe's format (``indent=1`` as msprobe writes them,
statistics task, PyTorch names: forward, backward and parameter-gradient entries of Linear
modules) with N entries each, B being A with rounding-level noise and one perturbed layer,
then times, side by side in one run (each compare in a fresh process of its own, imports
excluded from its timing; the parse in this process):

- the raw JSON parse of both files with the standard library (``json.load``, as a user, and
  msprobe, would parse them), one after the other in this process;
- our compare (``compare.api.compare(a, b, out=...)``, what ``probe compare --out`` runs: parse,
  normalise, match, metrics, verdicts, localise, and writing compare.csv/compare.parquet/
  nodes.parquet/summary.json, each as soon as its part is ready);
- msprobe's compare (``msprobe.pytorch.compare.pt_compare.pt_compare``, statistics mode, which
  writes its CSV) in the
  venv given by ``--msprobe-python`` (default ``.venv-bench/bin/python``; skipped, saying so,
  when msprobe is not installed there).

It prints ``msprobe / ours`` and ``ours / parse`` in wall-clock time, and the same ratios in CPU
time, which a machine shared with other work distorts less (CPU time counts child processes on
every side: ours reads the two dumps in two processes when they are large; msprobe may use a
pool), and the peak resident memory of each compare's process tree (sampled every 20 ms) against
the size of the two inputs (ours: judged on one more, untimed run's proportional set size,
which counts a page shared by its processes once; the timed runs' resident sizes summed are
printed beside it). The targets (:data:`TARGETS`), judged on wall-clock time and peak
memory: msprobe / ours ≥ 20 at 20k entries; ≥ 40 with peak memory ≤ 4x the inputs at 100k;
under 60 s and 8 GiB at 1M (msprobe's run there is capped by ``--msprobe-timeout`` and
``--msprobe-max-mb``, and reported as not finished when it hits either); ours / parse ≤ 2 at
every size.

The parse and our compare run ``--repeat`` times (default 5) and msprobe's compare
``--msprobe-repeat`` times (default 3; one run takes 10-70 s), in interleaved rounds, each after
a short idle pause (``--pause``), so that the minutes-long swings of a shared VM's speed (one of
our runs took 0.52-0.78 s at 20k entries here) hit every side alike; medians are compared, and
the spread is printed.

``--nonfinite`` adds, at each size, a pair whose B holds ``NaN``/``Infinity``/``-Infinity``
literals and whose names hold escapes (the native scanner reads both; the targets are the same).

    python benchmarks/bench_compare.py --entries 20000 100000
    python benchmarks/bench_compare.py --entries 100000 --nonfinite --repeat 3
    python benchmarks/bench_compare.py --entries 1000000 --repeat 1 --msprobe-repeat 1 --msprobe-timeout 600
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _tensor(r: random.Random, shape: list[int], scale: float, noise: float, rng_b: random.Random) -> dict:
    mx, mn, mean, norm = r.random() * 3 * scale, -r.random() * 3 * scale, (r.random() - 0.5) * 0.1 * scale, \
        (1 + r.random()) * 40 * scale

    def jitter(v: float) -> float:
        return v * (1 + noise * (rng_b.random() - 0.5)) if noise else v
    return {"type": "torch.Tensor", "dtype": "torch.float32", "shape": shape, "Max": jitter(mx),
            "Min": jitter(mn), "Mean": jitter(mean), "Norm": jitter(norm), "requires_grad": True}


def make_dump(path: Path, n: int, side: str, seed: int = 0, bad_layer: int = 7,
              nonfinite: bool = False) -> None:
    """Write a synthetic msprobe dump.json with ``n`` entries (and its construct.json); side
    ``b`` has layer ``bad_layer``'s output and weight scaled by 1.5. ``nonfinite``: side ``b``'s
    every 50th layer's forward output holds ``Infinity``, ``NaN`` and ``-Infinity`` (bare JSON
    literals, as msprobe writes them), and every 100th layer of both sides has a non-ASCII
    name (``\u00e9`` escapes in the file, as json.dump writes them)."""
    r, rb = random.Random(seed), random.Random(seed + (1 if side == "b" else 0))
    noise = 2e-7 if side == "b" else 0.0
    data, construct = {}, {}
    k = 0
    while len(data) < n:
        name = f"Module.layers.{k}.proj{'é' if nonfinite and k % 100 == 3 else ''}.Linear"
        bad = side == "b" and k == bad_layer
        sc = 1.5 if bad else 1.0
        out = _tensor(r, [4, 64, 256], sc, noise, rb)
        if nonfinite and side == "b" and k % 50 == 11:
            out.update(Max=float("inf"), Min=float("nan"), Mean=float("-inf"))
        data[f"{name}.forward.0"] = {
            "input_args": [_tensor(r, [4, 64, 256], 1.0, noise, rb)], "input_kwargs": {},
            "output": [out],
            "parameters": {"weight": _tensor(r, [256, 256], sc, noise, rb),
                           "bias": _tensor(r, [256], 1.0, noise, rb)}}
        data[f"{name}.backward.0"] = {"input": [_tensor(r, [4, 64, 256], 1.0, noise, rb)],
                                      "output": [_tensor(r, [4, 64, 256], 1.0, noise, rb)]}
        data[f"{name}.parameters_grad.0"] = {"weight": [_tensor(r, [256, 256], 1.0, noise, rb)],
                                             "bias": [_tensor(r, [256], 1.0, noise, rb)]}
        construct[f"{name}.forward.0"] = None
        construct[f"{name}.backward.0"] = None
        k += 1
    data = dict(list(data.items())[:n])
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump({"task": "statistics", "level": "L0", "framework": "pytorch",
                   "dump_data_dir": None, "data": data}, f, indent=1)
    with open(path.parent / "construct.json", "w") as f:
        json.dump(construct, f, indent=1)
    with open(path.parent / "stack.json", "w") as f:
        f.write("{}")


_MSPROBE = r"""
import sys, time, logging
logging.disable(logging.CRITICAL)
import os
from msprobe.pytorch.compare.pt_compare import pt_compare
def cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
t, c = time.perf_counter(), cpu()
pt_compare({"npu_path": sys.argv[1], "bench_path": sys.argv[2], "is_print_compare_log": False}, sys.argv[3])
print("MSPROBE_SECONDS", time.perf_counter() - t, cpu() - c)
"""


_OURS = r"""
import os, sys, time
sys.path.insert(0, sys.argv[4])
from probe.commands.compare import setup_process
setup_process()                            # as `probe compare` sets up its process
import duckdb, numpy, numpy.ma, pyarrow.compute, pyarrow.csv, pyarrow.parquet, pyarrow.ipc  # imports
import concurrent.futures, logging                                  # outside the timing
import probe.compare.api, probe.compare.pipeline, probe.compare.match, probe.compare.normalise, probe.compare.localise
import probe.compare.report, probe.compare.metrics, probe.compare.tensor_rows, probe.compare.node_rows
import probe.collectors.msprobe_reader, probe.collectors.msprobe_scan
def cpu():
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
t, c = time.perf_counter(), cpu()
r = probe.compare.api.compare(sys.argv[1], sys.argv[2], out=sys.argv[3])   # as `probe compare --out`
print("OURS_SECONDS", time.perf_counter() - t, cpu() - c, r.rows.num_rows, r.summary["verdicts"],
      (r.summary["first_divergence"] or {}).get("a"))
"""


#: Targets per size (entries): msprobe / ours at least ``ratio``, peak memory at most
#: ``mem_factor`` x the two inputs, at most ``wall`` seconds and ``peak_gib`` GiB.
TARGETS = {20000: {"ratio": 20}, 100000: {"ratio": 40, "mem_factor": 4},
           1000000: {"wall": 60, "peak_gib": 8}}
#: ours / parse at most this, at every size where the parse is timed (files up to
#: PARSE_MAX_MIB).
PARSE_RATIO = 2
PARSE_MAX_MIB = 256


def run_sampled(cmd: list[str], timeout: float | None = None, max_mb: float | None = None,
                pss: bool = False) -> dict:
    """Run ``cmd``: its output, return code, the peak resident memory of its process tree
    (sampled every 20 ms), and why it was stopped (``timeout`` seconds, ``max_mb`` of memory)
    or None. With ``pss``, also the peak of the tree's proportional set size (``peak_pss_mb``:
    a page shared by several processes counted once over them, where the resident sizes' sum
    counts it in each: a forked worker shares its parent's pages until either writes them);
    reading it walks the page tables, so only an untimed run asks for it."""
    import signal

    import psutil

    # Output to files, not pipes: a pipe is not read while the memory is sampled, and a child
    # that prints more than its 64 KiB (msprobe's progress on a 1M-entry pair) blocks on it.
    sink_out, sink_err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    p = subprocess.Popen(cmd, stdout=sink_out, stderr=sink_err, text=True, start_new_session=True)
    proc, peak, peak_pss, stopped, t0 = psutil.Process(p.pid), 0, 0, None, time.perf_counter()
    while p.poll() is None:
        total = shared_once = 0
        try:
            for x in [proc] + proc.children(recursive=True):
                if pss:
                    info = x.memory_full_info()
                    total += info.rss
                    shared_once += info.pss
                else:
                    total += x.memory_info().rss
        except psutil.Error:
            pass
        peak, peak_pss = max(peak, total), max(peak_pss, shared_once)
        if max_mb is not None and total > max_mb * 2**20:
            stopped = f"stopped at {total / 2**20:.0f} MB of memory (cap {max_mb:.0f} MB)"
        elif timeout is not None and time.perf_counter() - t0 > timeout:
            stopped = f"did not finish in {timeout:.0f} s"
        if stopped:
            os.killpg(p.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    p.wait()
    out, err = (_read_back(f) for f in (sink_out, sink_err))
    return {"stdout": out, "stderr": err, "rc": p.returncode, "peak_mb": peak / 2**20,
            "peak_pss_mb": peak_pss / 2**20 if pss else None, "stopped": stopped}


def _read_back(sink: Any) -> str:
    sink.seek(0)
    text = sink.read()
    sink.close()
    return text


def time_ours(a: Path, b: Path, out: Path, pss: bool = False) -> tuple[float, float, str, float]:
    """(wall, CPU incl. children, what it found, peak MB of its process tree) of our compare in
    a fresh process, as msprobe's is timed (imports excluded), so neither side pays for the
    other's heap. With ``pss`` the peak is the tree's proportional set size (see
    :func:`run_sampled`)."""
    r = run_sampled([sys.executable, "-c", _OURS, str(a), str(b), str(out), str(ROOT)], pss=pss)
    for line in r["stdout"].splitlines():
        if line.startswith("OURS_SECONDS"):
            _, wall, cpu, found = line.split(" ", 3)
            return float(wall), float(cpu), found, r["peak_pss_mb"] if pss else r["peak_mb"]
    raise SystemExit(f"our compare failed: {(r['stderr'] or r['stdout']).strip().splitlines()[-3:]}")


def time_msprobe(python: str, a: Path, b: Path, out: Path, timeout: float,
                 max_mb: float | None = None) -> tuple[float, float, float, str | None] | None:
    """(wall, CPU incl. children, peak MB, why it was stopped or None) of msprobe's compare
    call (import excluded; a stopped run's wall and CPU are inf); None when unavailable."""
    out.mkdir(parents=True, exist_ok=True)
    r = run_sampled([python, "-c", _MSPROBE, str(a), str(b), str(out)], timeout, max_mb)
    if r["stopped"]:
        return float("inf"), float("inf"), r["peak_mb"], r["stopped"]
    for line in r["stdout"].splitlines():
        if line.startswith("MSPROBE_SECONDS"):
            return float(line.split()[1]), float(line.split()[2]), r["peak_mb"], None
    print(f"  msprobe failed: {(r['stderr'] or r['stdout']).strip().splitlines()[-1:]}")
    return None


def _median(runs: list[tuple[float, float]]) -> tuple[float, float]:
    """(median wall, median CPU) of (wall, CPU) runs."""
    import statistics

    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def _cpu() -> float:
    """CPU seconds of this process and its finished children."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entries", type=int, nargs="+", default=[20000, 100000])
    ap.add_argument("--msprobe-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    ap.add_argument("--msprobe-timeout", type=float, default=1800,
                    help="Seconds after which msprobe's run is stopped and reported as not finished.")
    ap.add_argument("--msprobe-max-mb", type=float, default=12000,
                    help="Memory at which msprobe's run is stopped (the machine is shared).")
    ap.add_argument("--nonfinite", action="store_true",
                    help="After each size's finite pair, a second pair whose B holds NaN/Infinity "
                         "literals (and both sides escaped non-ASCII names): the dumps msprobe "
                         "writes for a run that overflows.")
    ap.add_argument("--work", default=None, help="Folder for the generated dumps (default: a temp dir).")
    ap.add_argument("--repeat", type=int, default=5,
                    help="Runs of the parse and of our compare, interleaved; medians are compared.")
    ap.add_argument("--msprobe-repeat", type=int, default=3,
                    help="Runs of msprobe's compare, interleaved with ours (one takes 10-70 s); the "
                         "median is compared.")
    ap.add_argument("--pause", type=float, default=1.0,
                    help="Seconds of idle before each timed run (a busy VM runs slower right "
                         "after a burst of work; each side gets the same pause).")
    args = ap.parse_args()

    have_msprobe = Path(args.msprobe_python).exists() and subprocess.run(
        [args.msprobe_python, "-c", "import msprobe"], capture_output=True).returncode == 0
    if not have_msprobe:
        print(f"msprobe not installed at {args.msprobe_python}: skipping its side "
              "(pip install mindstudio-probe into .venv-bench)")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_compare_"))
    ok = True
    runs = [(n, nf) for n in args.entries for nf in ((False, True) if args.nonfinite else (False,))]
    for n, nonfinite in runs:
        kind = f"n{n}" + ("_nonfinite" if nonfinite else "")
        a = work / kind / "a" / "step0" / "rank0" / "dump.json"
        b = work / kind / "b" / "step0" / "rank0" / "dump.json"
        if not a.exists():
            make_dump(a, n, "a", nonfinite=nonfinite)
            make_dump(b, n, "b", nonfinite=nonfinite)
        size = a.stat().st_size / 2**20
        inputs_mb = (a.stat().st_size + b.stat().st_size) / 2**20
        # json.load holds ~12x a file in Python objects: not of 800 MB files on a shared machine
        do_parse = size <= PARSE_MAX_MIB
        target = TARGETS.get(n, {})
        parses, ours_runs, ms_runs = [], [], []
        ms_ok, ms_stopped = have_msprobe, None
        # rounds interleave every side, so a drift of the machine's speed hits them all alike
        for i in range(max(args.repeat, args.msprobe_repeat if have_msprobe else 0)):
            if i < args.repeat:
                if do_parse:
                    time.sleep(args.pause)
                    t, c = time.perf_counter(), _cpu()
                    for p in (a, b):
                        with open(p) as f:
                            json.load(f)
                    parses.append((time.perf_counter() - t, _cpu() - c))
                time.sleep(args.pause)
                ours_runs.append(time_ours(a, b, work / kind / "ours_out"))
            if ms_ok and i < args.msprobe_repeat:
                time.sleep(args.pause)
                ms = time_msprobe(args.msprobe_python, a, b, work / kind / "msprobe_out",
                                  args.msprobe_timeout, args.msprobe_max_mb)
                if ms is None:
                    ms_ok = False
                elif ms[3]:
                    ms_stopped, ms_ok = ms, False       # once is enough: it will not finish
                else:
                    ms_runs.append(ms)
        ours, ours_cpu = _median([r[:2] for r in ours_runs])
        rss_peak = max(r[3] for r in ours_runs)
        # the memory judged: one more, untimed run whose tree's proportional set size is read
        # (the B dump's reader is a fork of the compare: the resident sizes' sum counts the
        # pages they share twice)
        time.sleep(args.pause)
        peak = time_ours(a, b, work / kind / "ours_out", pss=True)[3]
        found = ours_runs[-1][2]
        spread = f"min {min(r[0] for r in ours_runs):.2f}s, max {max(r[0] for r in ours_runs):.2f}s"
        print(f"{n} entries{' (B with NaN/Infinity literals)' if nonfinite else ''} ({size:.0f} MiB of JSON each, {inputs_mb:.0f} MiB both), median of "
              f"{len(ours_runs)}: ours {ours:.2f}s ({spread}; rows, verdicts, first divergence: {found}); "
              f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        if parses:
            parse, parse_cpu = _median(parses)
            ratio_parse = ours / parse
            print(f"  ours / parse   = {ratio_parse:.2f}  (parse: json.load, standard library, {parse:.2f}s; "
                  f"target <= {PARSE_RATIO}; CPU time: ours {ours_cpu:.2f}s / parse {parse_cpu:.2f}s = "
                  f"{ours_cpu / parse_cpu:.2f})")
            ok &= ratio_parse <= PARSE_RATIO
        else:
            print(f"  parse not timed: json.load of {size:.0f} MiB files would hold ~{12 * inputs_mb / 1024:.0f} GiB")
        mem_target = (f"target <= {target['mem_factor']}x = {target['mem_factor'] * inputs_mb:.0f} MB"
                      if "mem_factor" in target else
                      f"target <= {target['peak_gib']} GiB" if "peak_gib" in target else "no target")
        print(f"  peak memory: ours {peak:.0f} MB = {peak / inputs_mb:.1f}x the inputs ({mem_target}; "
              f"proportional set size of the process tree; its resident sizes summed, which count "
              f"the pages a forked reader shares with its parent twice: {rss_peak:.0f} MB = "
              f"{rss_peak / inputs_mb:.1f}x)")
        if "mem_factor" in target:
            ok &= peak <= target["mem_factor"] * inputs_mb
        if "peak_gib" in target:
            ok &= peak <= target["peak_gib"] * 1024
        if "wall" in target:
            print(f"  ours {ours:.1f}s (target < {target['wall']} s)")
            ok &= ours < target["wall"]
        if ms_runs:
            ms_wall, ms_cpu = _median([r[:2] for r in ms_runs])
            walls = ", ".join(f"{r[0]:.2f}" for r in ms_runs)
            want = f"target >= {target['ratio']}" if "ratio" in target else "no target"
            print(f"  msprobe {ms_wall:.2f}s (median of {len(ms_runs)}: {walls}; peak memory "
                  f"{max(r[2] for r in ms_runs):.0f} MB); msprobe / ours = {ms_wall / ours:.1f}  ({want}; "
                  f"CPU time: msprobe {ms_cpu:.2f}s / ours {ours_cpu:.2f}s = {ms_cpu / ours_cpu:.1f})")
            if "ratio" in target:
                ok &= ms_wall / ours >= target["ratio"]
        elif ms_stopped:
            print(f"  msprobe {ms_stopped[3]} (peak memory {ms_stopped[2]:.0f} MB); ours {ours:.1f}s")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
