"""Benchmark ``probe compare RUN_A RUN_B`` over many rank folders of one step.

Generates two runs of ``--ranks`` rank folders (default 64) holding ``--entries``-entry dump
pairs (default 20,000; the synthetic dumps of ``bench_compare.py``: B is A with rounding-level
noise and one perturbed layer, layer 7), where one rank (``--fault-rank``, default 37) has its
layer 3 perturbed instead, so it is the rank whose numerics diverge first. A few distinct dump
pairs are written and hard-linked into the rank folders (writing 128 files of 17 MB in Python
would take minutes; the compare reads every file all the same).

Then it times the command as a user runs it (a fresh ``probe compare`` process: start-up,
worker processes, every pair written to OUT/step0/rank<R>/, the run summary), ``--repeat``
times with an idle pause between, and prints the median and spread of the wall time, the CPU
time of the command and its workers over the wall time (how many cores it kept busy), the
peak resident memory of its process tree (sampled every 20 ms: bounded by the pairs in flight,
not by the ranks), and whether the summary names the fault rank first. With ``--cluster``
the same command runs on a local Dask cluster of ``--workers`` single-threaded workers
started here (loopback only) and its per-pair results are checked against the local run's.
With ``--msprobe`` msprobe's compare times one of the pairs, for scale.

    python benchmarks/bench_compare_ranks.py --ranks 64 --entries 20000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_compare import make_dump, time_msprobe  # noqa: E402

TEMPLATES = 4


def make_runs(work: Path, ranks: int, entries: int, fault_rank: int) -> tuple[Path, Path]:
    """RUN_A and RUN_B of ``ranks`` rank folders (step0), from a few distinct dump pairs."""
    a, b = work / "A", work / "B"
    if (b / "step0" / f"rank{ranks - 1}" / "dump.json").exists():
        return a, b
    tpl = work / "templates"
    for k in range(TEMPLATES):
        make_dump(tpl / f"a{k}" / "dump.json", entries, "a", seed=k)
        make_dump(tpl / f"b{k}" / "dump.json", entries, "b", seed=k)
    make_dump(tpl / "fault" / "dump.json", entries, "b", seed=fault_rank % TEMPLATES, bad_layer=3)
    for r in range(ranks):
        for run, src in ((a, tpl / f"a{r % TEMPLATES}"),
                         (b, tpl / ("fault" if r == fault_rank else f"b{r % TEMPLATES}"))):
            dst = run / "step0" / f"rank{r}"
            dst.mkdir(parents=True, exist_ok=True)
            for name in ("dump.json", "construct.json", "stack.json"):
                if not (dst / name).exists():
                    os.link(src / name, dst / name)
    return a, b


def run_measured(cmd: list[str]) -> dict:
    """Run ``cmd``; its wall time, CPU time (with every process under it), peak RSS of its
    process tree (sampled), return code and output."""
    import resource

    import psutil

    def children_cpu() -> float:
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        return ru.ru_utime + ru.ru_stime
    c0, t0 = children_cpu(), time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    proc = psutil.Process(p.pid)
    peak = 0
    while p.poll() is None:
        total = 0
        try:
            for x in [proc] + proc.children(recursive=True):
                total += x.memory_info().rss
        except psutil.Error:
            pass
        peak = max(peak, total)
        time.sleep(0.02)
    out, err = p.communicate()
    return {"wall": time.perf_counter() - t0, "cpu": children_cpu() - c0, "peak_mb": peak / 2**20,
            "rc": p.returncode, "stdout": out, "stderr": err}


def same_results(x: Path, y: Path, ranks: int) -> bool:
    """Whether two runs' per-pair results are identical (summary.json but elapsed_s, compare.csv
    byte for byte)."""
    for r in range(ranks):
        px, py = x / "step0" / f"rank{r}", y / "step0" / f"rank{r}"
        if (px / "compare.csv").read_bytes() != (py / "compare.csv").read_bytes():
            return False
        sx, sy = (json.loads((p / "summary.json").read_text()) for p in (px, py))
        sx.pop("elapsed_s")
        sy.pop("elapsed_s")
        if sx != sy:
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--entries", type=int, default=20000)
    ap.add_argument("--fault-rank", type=int, default=37)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pause", type=float, default=2.0)
    ap.add_argument("--target", type=float, default=120.0, help="Seconds the run must take at most.")
    ap.add_argument("--work", default=None, help="Folder for the generated runs (default: a temp dir).")
    ap.add_argument("--cluster", action="store_true",
                    help="Also run on a local Dask cluster (loopback) and check its results.")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--msprobe", action="store_true", help="Time msprobe's compare on one pair.")
    ap.add_argument("--msprobe-python", default=str(ROOT / ".venv-bench" / "bin" / "python"))
    args = ap.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="bench_compare_ranks_"))
    t = time.perf_counter()
    a, b = make_runs(work, args.ranks, args.entries, min(args.fault_rank, args.ranks - 1))
    size = sum(f.stat().st_size for f in a.rglob("dump.json")) + sum(f.stat().st_size for f in b.rglob("dump.json"))
    print(f"{args.ranks} rank pairs of {args.entries} entries ({size / 2**30:.2f} GiB of dump.json; "
          f"runs ready in {time.perf_counter() - t:.0f} s); {os.cpu_count()} cores, load "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    probe = [sys.executable, "-m", "probe.cli", "compare", str(a), str(b)]
    runs = []
    for i in range(args.repeat):
        time.sleep(args.pause)
        r = run_measured(probe + ["--out", str(work / "out_local")])
        if r["rc"] not in (0, 1):
            raise SystemExit(f"probe compare failed: {r['stderr'].strip().splitlines()[-1:]}")
        runs.append(r)
        print(f"  run {i + 1}: {r['wall']:.1f} s wall, {r['cpu']:.1f} s CPU ({r['cpu'] / r['wall']:.2f} cores), "
              f"peak {r['peak_mb']:.0f} MB")
    summary = json.loads((work / "out_local" / "summary.json").read_text())
    first = summary["first_divergence"] or {}
    walls = [r["wall"] for r in runs]
    wall = statistics.median(walls)
    ok = wall <= args.target and first.get("rank") == args.fault_rank and summary["compared"] == args.ranks
    print(f"local, {os.cpu_count()} workers: median {wall:.1f} s (min {min(walls):.1f}, max {max(walls):.1f}; "
          f"target <= {args.target:.0f} s), {statistics.median(r['cpu'] for r in runs) / wall:.2f} cores busy, "
          f"peak {max(r['peak_mb'] for r in runs):.0f} MB for {size / 2**20:.0f} MiB of input; "
          f"{wall / args.ranks:.2f} s a pair")
    print(f"  first divergence across ranks: rank {first.get('rank')} ({first.get('direction')}) "
          f"{first.get('a')} (expected rank {args.fault_rank}); {first.get('ranks')} of "
          f"{summary['compared']} pairs diverge")
    if args.cluster:
        from distributed import LocalCluster

        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=None) as cluster:
            time.sleep(args.pause)
            r = run_measured(probe + ["--out", str(work / "out_cluster"), "--cluster", cluster.scheduler_address])
        same = r["rc"] in (0, 1) and same_results(work / "out_local", work / "out_cluster", args.ranks)
        print(f"Dask cluster of {args.workers} local workers: {r['wall']:.1f} s wall (client side: "
              f"{r['cpu']:.1f} s CPU, peak {r['peak_mb']:.0f} MB); results identical to the local run: {same}")
        ok &= same
    if args.msprobe:
        pair = work / "templates"
        ms = time_msprobe(args.msprobe_python, pair / "a0" / "dump.json", pair / "b0" / "dump.json",
                          work / "msprobe_out", 1800)
        if ms is not None:
            print(f"msprobe's compare of one pair: {ms[0]:.1f} s; {args.ranks} pairs one after another "
                  f"~{ms[0] * args.ranks / 60:.0f} min (ours: {wall:.1f} s for all)")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
