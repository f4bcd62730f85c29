"""The human summary of a simulation, written from ``simulation.json`` (so the two agree).

>>> print(format_bytes(3 * 2**30), format_bytes(1536), format_seconds(0.0123))
3.00 GiB 1.50 KiB 12.3 ms
"""

from __future__ import annotations

LEVEL_WORDS = {0: "operators and module tree", 1: "+ memory from op inputs and outputs",
               2: "+ workspaces and the allocator", 3: "+ time"}


def format_bytes(n: float | None) -> str:
    """``n`` bytes in binary units."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def format_seconds(s: float | None) -> str:
    """``s`` seconds in a readable unit."""
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.1f} us"


def summary(doc: dict) -> str:
    """The summary lines of ``doc`` (a ``simulation.json``)."""
    lines = [_headline(doc), f"parameters: {doc['params']:,}"]
    ops = doc["operators"]
    phases = ", ".join(f"{k} {v}" for k, v in sorted(ops["by_phase"].items()))
    lines.append(f"traced {ops['total_ops_traced']:,} ops; step {ops['step']} runs {ops['count']:,} "
                 f"({phases}) in {len(doc['modules'])} modules")
    if doc["level"] >= 1:
        lines += _memory(doc)
        lines += _verdicts(doc)
    if doc.get("step"):
        lines += _step(doc)
    lines += [f"note: {note}" for note in doc["notes"]]
    return "\n".join(lines)


def _headline(doc: dict) -> str:
    w, lay = doc["workload"], doc["layout"]
    what = (f"bundled engine {w['engine']}/{w['preset']} ({w['dtype']}, seq {w['seq_len']})"
            if w["workload"] == "bundled engine" else f"script {w['script']}")
    return (f"simulated {what} on {lay['nproc']} rank(s): dp {lay['dp']} x tp {lay['tp']} x "
            f"pp {lay['pp']}, ZeRO {lay['zero']}, global batch {lay['global_batch']}, micro batch "
            f"{lay['micro_batch']} x {lay['microbatches']}; level {doc['level']} "
            f"({LEVEL_WORDS[doc['level']]})")


def _memory(doc: dict) -> list[str]:
    lines = [f"memory per rank on {doc['device']['name']}:"]
    for r in doc["ranks"]:
        m = r["memory"]
        who = f"rank {r['rank']}" + (f" (and {len(r['ranks_like']) - 1} like it)" if "ranks_like" in r else "")
        parts = ", ".join(f"{k} {format_bytes(m[k])}" for k in ("params", "grads", "optimizer", "activations"))
        extra = f", reserved {format_bytes(m['reserved'])}" if "reserved" in m else ""
        lines.append(f"  {who}, {r['label']}: {parts}; peak {format_bytes(m['peak'])}{extra}")
        lines.append(f"    holds {r['holds']}")
    lines.append("  at the peak of the fullest rank:")
    for h in doc["peak_holders"][:6]:
        lines.append(f"    {format_bytes(h['bytes']):>12}  {h['category']:<12} {h['module']}")
    return lines


def _verdicts(doc: dict) -> list[str]:
    lines = [f"  {'device':<8} {'memory':>11} {'peak':>11} {'reserved':>11}  {'verdict':<13} "
             f"{'step time':>10} {'MFU':>6}"]
    for v in doc["verdicts"]:
        mfu = f"{v['mfu'] * 100:.1f}%" if v.get("mfu") is not None else "-"
        lines.append(f"  {v['device']:<8} {format_bytes(v['memory_bytes']):>11} "
                     f"{format_bytes(v['peak_bytes']):>11} {format_bytes(v['reserved_bytes']):>11}  "
                     f"{v['verdict']:<13} {format_seconds(v.get('step_time_s')):>10} {mfu:>6}")
    return ["verdict per device, for the fullest rank (tight: fits once the allocator frees its "
            "cache):"] + lines


def _step(doc: dict) -> list[str]:
    s = doc["step"]
    compute = ", ".join(f"{k} {format_seconds(v)}" for k, v in s["compute_s"].items() if v)
    mfu = f"; MFU {s['mfu'] * 100:.1f}%" if s.get("mfu") is not None else ""
    bubble = f", pipeline bubble {format_seconds(s['pipeline_bubble_s'])}" if s["pipeline_bubble_s"] else ""
    return [f"step on {doc['device']['name']}: {format_seconds(s['step_time_s'])} "
            f"(compute: {compute}; communication {format_seconds(s['comm_s'])}, exposed "
            f"{format_seconds(s['exposed_comm_s'])}{bubble}){mfu}"]
