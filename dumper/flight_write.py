"""A flight recorder's ring written as an ordinary dump, marked with what triggered it.

Each kept step becomes ``OUT/step{N}/rank{R}/dump.json, construct.json, stack.json`` through
the msprobe writer every dump uses (:mod:`probe.collectors.msprobe_writer`) and TENSOR and NODE
records in the rank's store, so ``probe compare``, ``probe query`` and ``probe web`` read it as
any dump. Beside them ``OUT/flight_recorder/rank{R}.json`` says why and when:
``{"rank", "trigger", "reason", "step", "steps", "level", "time_ns", "world_size"}`` (one line
per trigger in ``triggers``; the last one at the top) — what ``probe origin`` starts from.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from probe.collectors import msprobe_writer

#: the folder of the trigger markers under OUT
MARKER_DIR = "flight_recorder"


def marker_path(out: str, rank: int) -> str:
    return os.path.join(out, MARKER_DIR, f"rank{int(rank)}.json")


def write_ring(ring: Any, out: str, *, rank: int, run: str, trigger: str, reason: str,
               store: Any = None, world_size: int = 1, framework: str = "pytorch") -> list[int]:
    """Write every step ``ring`` keeps; returns the steps written."""
    from probe.collectors.records import table_from_columns

    steps = ring.snapshot()
    now = time.time_ns()
    columns: dict[str, list] = {k: [] for k in ("run", "rank", "step", "seq", "node", "node_kind",
                                                "direction", "slot", "index", "dtype", "shape",
                                                "numel", "max", "min", "mean", "l2norm",
                                                "nan_count", "inf_count", "host_ts_ns")}
    all_nodes: dict[str, None] = {}
    for step, data in steps:
        construct = ring.construct(data)
        msprobe_writer.write_step(out, step=step, rank=rank, data=data, construct=construct,
                                  stacks={}, task="statistics", level=ring.level, framework=framework)
        seq = 0
        for node, entry in data.items():
            all_nodes.setdefault(node, None)
            kind = ring.nodes.get(node, ("module",))[0]
            direction = "forward" if node.endswith(".forward") or ".forward." in node else "backward"
            for slot, index, value in _values(entry):
                if not isinstance(value, dict) or "Max" not in value:
                    continue
                stats = [_number(value.get(k)) for k in ("Max", "Min", "Mean", "Norm")]
                numel = 1
                for d in value.get("shape", []):
                    numel *= int(d)
                for name, v in (("run", run), ("rank", rank), ("step", step), ("seq", seq),
                                ("node", node), ("node_kind", kind), ("direction", direction),
                                ("slot", slot), ("index", index), ("dtype", value.get("dtype")),
                                ("shape", value.get("shape")), ("numel", numel),
                                ("max", stats[0]), ("min", stats[1]), ("mean", stats[2]),
                                ("l2norm", stats[3]), ("nan_count", int(value.get("nan_count", 0))),
                                ("inf_count", int(value.get("inf_count", 0))), ("host_ts_ns", now)):
                    columns[name].append(v)
                seq += 1
    if store is not None and columns["node"]:
        store.write("tensor", table_from_columns("tensor", columns))
        construct = ring.construct(all_nodes)
        nodes = list(all_nodes)
        store.write("node", table_from_columns("node", {
            "run": [run] * len(nodes), "rank": [rank] * len(nodes), "node": nodes,
            "parent": [construct.get(n) for n in nodes],
            "class_name": [ring.nodes.get(n, (None, None))[1] for n in nodes],
            "depth": [0] * len(nodes), "order": list(range(len(nodes))), "stack_ref": [None] * len(nodes)}))
        store.end_step(steps[-1][0] if steps else None)
    written = [s for s, _ in steps]
    _mark(out, rank, {"rank": rank, "trigger": trigger, "reason": reason,
                      "step": written[-1] if written else None, "steps": written,
                      "level": ring.level, "ring_steps": ring.k, "time_ns": now,
                      "world_size": world_size})
    return written


def _mark(out: str, rank: int, record: dict) -> None:
    path = marker_path(out, rank)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    earlier: list = []
    try:
        with open(path, encoding="utf-8") as f:
            earlier = json.load(f).get("triggers", [])
    except (OSError, ValueError, AttributeError):
        earlier = []
    record = {**record, "triggers": [*earlier, {k: record[k] for k in ("trigger", "reason", "step", "steps")}]}
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)


def _values(entry: dict):
    """``(slot, index, value)`` of an entry the ring wrote."""
    if "input" in entry and "output" in entry and "input_args" not in entry:
        for key in ("input", "output"):
            for i, v in enumerate(entry[key]):
                yield key, str(i), v
        return
    if "output" in entry:
        for i, v in enumerate(entry["output"]):
            yield "output", str(i), v
        return
    for pname, values in entry.items():
        for v in values:
            yield "parameter_grad", pname, v


def _number(v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if v is msprobe_writer.NAN:
        return float("nan")
    if v is msprobe_writer.POS_INF:
        return float("inf")
    if v is msprobe_writer.NEG_INF:
        return float("-inf")
    return None
