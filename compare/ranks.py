"""Compare two runs rank by rank: every (step, rank) dump pair, on every core, streamed.

``probe compare RUN_A RUN_B`` on two run (or step) folders that hold several dumps:

1. **pairs**: each run's dump.json files keyed by their (step, rank) folders
   (:func:`probe.collectors.msprobe_layout.ranked_dump_files`: ``step{N}/rank{R}``, msprobe
   26.2's ``step{N}/proc{PID}`` with its processes numbered in PID order, a plain ``rank{R}``);
   the keys both runs hold are compared, every step of each, the others listed as missing on
   one side;
2. **compare**: each pair by :func:`probe.compare.api.compare` on one core (``parallel=False``,
   the same result as comparing it alone) into ``OUT/step{S}/rank{R}/``, one pair per worker
   at a time: a local pool of processes, one per core, or, given a Dask distributed
   scheduler's address, that cluster's workers (which must see the same paths). A worker
   sends back the pair's summary only, so memory is bounded by the pairs in flight, never by
   the number of ranks;
3. **summary**: results are reported as they come in; ``OUT/summary.json`` lists every pair and
   names where the runs diverge first across ranks: the pair whose first divergence comes
   earliest (the earliest step, then forward before backward, then the earliest node in
   execution order, then the lowest rank), and likewise the first NaN/Inf.

>>> r = compare_runs("runs/A", "runs/B", "cmp")          # doctest: +SKIP
>>> r["first_divergence"]["rank"], r["compared"]          # doctest: +SKIP
(37, 64)
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from probe.ground.errors import ProbeError

__all__ = ["rank_pairs", "compare_pair", "compare_runs", "format_runs", "format_pair"]


def rank_pairs(a: str | os.PathLike, b: str | os.PathLike) -> tuple[list[dict], list, list]:
    """The (step, rank) pairs of dumps two folders both hold, in (step, rank) order, each
    ``{"step", "rank", "a", "b"}``; and the keys only A, only B holds. Empty when either is
    not a folder holding more than one dump between them (a single compare, not per rank)."""
    from probe.collectors.msprobe_layout import ranked_dump_files

    pa, pb = Path(a), Path(b)
    if not (pa.is_dir() and pb.is_dir()):
        return [], [], []
    ka, kb = ranked_dump_files(pa), ranked_dump_files(pb)
    if len(ka) < 2 and len(kb) < 2:
        return [], [], []

    def order(k: tuple) -> tuple:
        return tuple(-1 if v is None else v for v in k)
    both = sorted(set(ka) & set(kb), key=order)
    pairs = [{"step": s, "rank": r, "a": str(ka[(s, r)]), "b": str(kb[(s, r)])} for s, r in both]
    return (pairs, sorted(set(ka) - set(kb), key=order), sorted(set(kb) - set(ka), key=order))


def compare_pair(a: str, b: str, out: str, mapping: str | None = None) -> dict:
    """Compare one pair into ``out`` on this core alone; its summary as :func:`compare_runs`
    lists it (``error``: the one-line error when it could not be compared). Runs in a
    worker: a local pool's process or a Dask worker."""
    from probe.compare.api import compare

    try:
        r = compare(a, b, mapping=mapping, out=out, parallel=False)
    except ProbeError as e:
        return {"error": str(e)}
    s = r.summary
    counts = {k: v for k, v in s["counts"].items() if k != "counted"}
    return {"verdicts": s["verdicts"], "counts": counts, "worst": r.worst_verdict,
            "matched": s["matched"], "unmatched_a": s["unmatched_a"], "unmatched_b": s["unmatched_b"],
            "first_divergence": _placed(r.nodes, s["first_divergence"]),
            "first_nan": _placed(r.nodes, s["first_nan"]), "elapsed_s": s["elapsed_s"],
            "dtypes": sorted(s["tolerance"]["dtypes"]) if s.get("tolerance") else []}


def _placed(nodes: Any, finding: dict | None) -> dict | None:
    """A finding with ``ord``, the execution order of its node (to compare across ranks)."""
    if finding is None:
        return None
    import pyarrow.compute as pc

    hit = pc.and_(pc.equal(nodes.column("direction"), finding["direction"]),
                  pc.equal(nodes.column("node_a"), finding["a"]) if finding["a"] is not None
                  else pc.equal(nodes.column("node_b"), finding["b"]))
    orders = nodes.column("ord").filter(pc.fill_null(hit, False))
    return {**finding, "ord": orders[0].as_py() if len(orders) else None}


def _local(tasks: list[tuple], workers: int) -> Iterator[tuple[int, dict]]:
    """(task index, result) of each task as it finishes, on ``workers`` local processes."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ctx = multiprocessing.get_context("spawn")      # no fork of a process holding threads
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
        futures = {pool.submit(compare_pair, *t): i for i, t in enumerate(tasks)}
        for f in as_completed(futures):
            yield futures[f], f.result()


def _cluster(tasks: list[tuple], address: str) -> Iterator[tuple[int, dict]]:
    """(task index, result) of each task as it finishes, on a Dask distributed cluster."""
    try:
        from distributed import Client, as_completed
    except ImportError:
        raise ProbeError("--cluster needs Dask distributed: pip install 'probe-toolchain[distributed]'") from None
    try:
        client = Client(address, timeout=10)
    except (OSError, TimeoutError, ValueError) as e:
        raise ProbeError(f"{address}: no Dask scheduler answers there ({str(e).splitlines()[0]}); "
                         "start one (dask scheduler) with workers that see these paths") from None
    try:
        futures = [client.submit(compare_pair, *t, pure=False, key=f"probe-compare-{i}-{time.time_ns()}")
                   for i, t in enumerate(tasks)]
        index = {f.key: i for i, f in enumerate(futures)}
        for f in as_completed(futures):
            yield index[f.key], f.result()
    finally:
        client.close()


def compare_runs(a: str | os.PathLike, b: str | os.PathLike, out: str | os.PathLike,
                 mapping: str | None = None, workers: int | None = None, cluster: str | None = None,
                 report: Callable[[dict], None] | None = None) -> dict:
    """Compare runs ``a`` and ``b`` rank by rank into ``out`` (see the module docstring) and
    return the run summary written to ``out/summary.json``. ``workers``: local processes (one
    per core when None); ``cluster``: a Dask scheduler address (``tcp://host:8786``) to use
    instead; ``report``: called with each pair's entry as it finishes."""
    from probe.compare.report import tolerance_rule

    pairs, only_a, only_b = rank_pairs(a, b)
    if not pairs:
        raise ProbeError(f"{a} and {b}: no (step, rank) dump both hold; give runs with the same "
                         "step<N>/rank<R> folders, or two dump.json files")
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProbeError(f"{out}: cannot write the compare result ({e.strerror})") from None
    t0 = time.perf_counter()
    for p in pairs:
        p["out"] = str(out / _folder(p))
    tasks = [(p["a"], p["b"], p["out"], mapping) for p in pairs]
    if cluster:
        results = _cluster(tasks, cluster)
    else:
        results = _local(tasks, max(1, workers or os.cpu_count() or 1))
    for i, r in results:
        pairs[i].update(r)
        if report is not None:
            report(pairs[i])
    summary = {"a": str(a), "b": str(b), "pairs": len(pairs), "compared": sum("error" not in p for p in pairs),
               "only_a": [_name(k) for k in only_a], "only_b": [_name(k) for k in only_b],
               "verdicts": _total(p.get("verdicts", {}) for p in pairs),
               "first_divergence": _earliest(pairs, "first_divergence"),
               "first_nan": _earliest(pairs, "first_nan"),
               "worst": _worst(p.get("worst") for p in pairs),
               "tolerance": tolerance_rule(sorted({d for p in pairs for d in p.get("dtypes", [])})),
               "ranks": pairs, "workers": cluster or max(1, workers or os.cpu_count() or 1),
               "elapsed_s": round(time.perf_counter() - t0, 3)}
    from probe.compare.report import write_atomically

    try:
        write_atomically(out / "summary.json",
                         lambda tmp: tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n"))
    except OSError as e:
        raise ProbeError(f"{out}: cannot write the compare result ({e.strerror})") from None
    return summary


def _folder(p: dict) -> str:
    return "/".join(x for x in (None if p["step"] is None else f"step{p['step']}",
                                None if p["rank"] is None else f"rank{p['rank']}") if x) or "pair"


def _name(key: tuple) -> str:
    step, rank = key
    return f"step {step} rank {rank}"


def _total(counts: Iterator[dict]) -> dict:
    total: dict[str, int] = {}
    for c in counts:
        for k, n in c.items():
            total[k] = total.get(k, 0) + n
    return dict(sorted(total.items()))


def _worst(verdicts: Iterator[str | None]) -> str:
    from probe.compare.verdict import worst

    return worst(v for v in verdicts if v)


def _earliest(pairs: list[dict], key: str) -> dict | None:
    """The pair whose ``key`` finding comes first (step, direction, execution order, rank)."""
    found = [p for p in pairs if p.get(key)]
    if not found:
        return None

    def when(p: dict) -> tuple:
        f = p[key]
        return (p["step"] if p["step"] is not None else -1, f["direction"] != "forward",
                f["ord"] if f["ord"] is not None else 1 << 62, p["rank"] if p["rank"] is not None else -1)
    first = min(found, key=when)
    return {"step": first["step"], "rank": first["rank"], **first[key],
            "ranks": sum(1 for p in found)}


def format_runs(s: dict) -> str:
    """The terminal summary of :func:`compare_runs`: totals, missing pairs, where the runs
    diverge first across ranks."""
    from probe.compare.verdict import VERDICTS

    lines = [f"compare {s['a']}  vs  {s['b']}: {s['compared']} of {s['pairs']} (step, rank) pairs",
             "tensors: " + (", ".join(f"{v} {s['verdicts'][v]}" for v in VERDICTS if s["verdicts"].get(v))
                            or "none")]
    if s.get("tolerance"):
        lines.append(s["tolerance"]["rule"])
    for side in ("only_a", "only_b"):
        if s[side]:
            lines.append(f"only in {side[-1].upper()}: {', '.join(s[side][:8])}"
                         + (f" and {len(s[side]) - 8} more" if len(s[side]) > 8 else ""))
    for key, label in (("first_divergence", "first divergence"), ("first_nan", "first NaN/Inf")):
        f = s.get(key)
        if f:
            lines.append(f"{label}: step {f['step']} rank {f['rank']} ({f['direction']}): "
                         f"{f['a'] or f['b']}  ({f['ranks']} of {s['compared']} pairs have one)")
            if f.get("reason"):
                lines.append(f"    {f['reason']}")
        else:
            lines.append(f"{label}: none")
    return "\n".join(lines)


def format_pair(p: dict) -> str:
    """One pair's line, as it finishes."""
    where = f"step {p['step']} rank {p['rank']}"
    if "error" in p:
        return f"{where}: error: {p['error']}"
    from probe.compare.verdict import VERDICTS

    counts = ", ".join(f"{v} {p['verdicts'][v]}" for v in VERDICTS if p["verdicts"].get(v))
    f = p.get("first_divergence")
    tail = f"; first divergence ({f['direction']}) {f['a'] or f['b']}" if f else "; no divergence"
    return f"{where}: {counts}{tail}"
