"""Cost of ``probe simulate`` at scale: the 7b preset on 1,024 ranks at level 3.

Each configuration runs as ``probe simulate`` would, in a fresh process (so its peak memory is
its own), timed on the wall clock and measured for CPU seconds and peak resident memory
(``ru_maxrss`` of that child, from ``wait4``). Printed beside each: the per-rank figures it predicted (peak,
reserve, step time, MFU on H100) and how many ranks were traced for how many simulated.

Targets (issue 16): 7b on 1,024 ranks at level 3 in under 2 minutes and under 4 GB on a
2-core machine. A second line, 7b on 4,096 ranks with tensor and pipeline parallelism and
ZeRO-1 in bfloat16, shows the cost of several distinct pipeline stages.

Run: ``python benchmarks/bench_simulate.py [--skip-layout]``; exit code 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TARGET_S = 120.0
TARGET_BYTES = 4 * 10**9

CONFIGS = {
    "7b x 1024, dp, level 3": ["--preset", "7b", "--nproc", "1024", "--level", "3"],
    "7b x 4096, tp 8 pp 4 zero 1 bf16, level 3": ["--preset", "7b", "--nproc", "4096", "--tp", "8",
                                                 "--pp", "4", "--zero", "1", "--dtype", "bf16",
                                                 "--level", "3"],
}


def run(args: list[str]) -> dict:
    """Run ``probe simulate ARGS`` in a child; its wall and CPU seconds, peak RSS and JSON."""
    out = tempfile.mkdtemp(prefix="bench-simulate-")
    start = time.perf_counter()
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "probe.cli", "simulate", *args, "--out", out],
                                stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            err.seek(0)
            raise SystemExit(f"probe simulate {' '.join(args)} failed: {err.read().strip()}")
    with open(os.path.join(out, "simulation.json"), encoding="utf-8") as f:
        doc = json.load(f)
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "rss_bytes": usage.ru_maxrss * 1024,
            "doc": doc}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-layout", action="store_true", help="only the 7b x 1024 target")
    opts = parser.parse_args()
    ok = True
    print(f"{'configuration':<44} {'wall':>7} {'cpu':>7} {'peak RSS':>9}  traced/ranks  "
          f"{'peak/rank':>10} {'reserve':>9} {'step H100':>10} {'MFU':>6}")
    for i, (name, args) in enumerate(CONFIGS.items()):
        if opts.skip_layout and i:
            continue
        r = run(args)
        doc = r["doc"]
        worst = max(doc["ranks"], key=lambda x: x["memory"]["peak"])
        ranks = sum(len(x.get("ranks_like", [x["rank"]])) for x in doc["ranks"])
        mfu = doc["step"]["mfu"]
        print(f"{name:<44} {r['wall_s']:>6.1f}s {r['cpu_s']:>6.1f}s {r['rss_bytes'] / 1e9:>7.2f}GB  "
              f"{len(doc['ranks']):>5}/{ranks:<6} {worst['memory']['peak'] / 2**30:>8.1f}Gi "
              f"{worst['memory']['reserved'] / 2**30:>7.1f}Gi {doc['step']['step_time_s']:>9.3f}s "
              f"{mfu * 100 if mfu else 0:>5.1f}%")
        if i == 0:
            met = r["wall_s"] < TARGET_S and r["rss_bytes"] < TARGET_BYTES
            ok &= met
            print(f"  target: under {TARGET_S:.0f} s and {TARGET_BYTES / 1e9:.0f} GB: "
                  f"{'met' if met else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
