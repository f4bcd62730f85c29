"""A checker for the Chrome trace JSON that Perfetto's JSON importer accepts.

It checks what the importer relies on: every event has ``ph``, ``name``, ``pid`` and ``tid``;
timed events have a finite ``ts`` (µs); complete events (``X``) have ``dur >= 0``; complete
events on one thread track nest strictly (a slice that starts inside another ends inside it);
async begin/end pairs (``b``/``e``) match by ``cat`` and ``id``; metadata events name processes
and threads. It returns the problems found (an empty list means valid).
"""

from __future__ import annotations

import math
from collections import defaultdict

PHASES = {"X", "B", "E", "i", "I", "b", "e", "n", "M", "C", "s", "t", "f", "P", "O", "N", "D"}
METADATA = {"process_name", "thread_name", "process_sort_index", "thread_sort_index", "process_labels"}
EPS_US = 1e-3


def trace_problems(trace: object) -> list[str]:
    problems: list[str] = []
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list):
        return ["top level: no traceEvents list"]
    if isinstance(trace, dict) and trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append("displayTimeUnit must be 'ms' or 'ns'")
    slices: dict[tuple, list[tuple[float, float, str]]] = defaultdict(list)
    open_async: dict[tuple, int] = defaultdict(int)
    for i, ev in enumerate(events):
        where = f"event {i}"
        if not isinstance(ev, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = ev.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: bad ph {ph!r}")
            continue
        if not isinstance(ev.get("name"), str):
            problems.append(f"{where}: name is not a string")
        if not isinstance(ev.get("pid"), int):
            problems.append(f"{where}: pid is not an integer")
        if not isinstance(ev.get("tid"), (int, str)):
            problems.append(f"{where}: tid is not an integer or string")
        if ph == "M":
            if ev.get("name") not in METADATA or not isinstance(ev.get("args"), dict):
                problems.append(f"{where}: bad metadata event {ev.get('name')!r}")
            continue
        ts = ev.get("ts")
        if not isinstance(ts, (int, float)) or not math.isfinite(ts):
            problems.append(f"{where}: ts is not a finite number")
            continue
        if "args" in ev and not isinstance(ev["args"], dict):
            problems.append(f"{where}: args is not an object")
        if ph == "X":
            dur = ev.get("dur")
            if not isinstance(dur, (int, float)) or not math.isfinite(dur) or dur < 0:
                problems.append(f"{where}: X event without a non-negative dur")
                continue
            slices[(ev["pid"], ev["tid"])].append((ts, ts + dur, ev["name"]))
        elif ph in ("b", "e"):
            if "id" not in ev or "cat" not in ev:
                problems.append(f"{where}: async event without id and cat")
                continue
            key = (ev["pid"], ev["cat"], ev["id"], ev["name"])
            open_async[key] += 1 if ph == "b" else -1
            if open_async[key] < 0:
                problems.append(f"{where}: async end before its begin")
        elif ph in ("i", "I") and ev.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"{where}: bad instant scope {ev.get('s')!r}")
    for key, n in open_async.items():
        if n:
            problems.append(f"async {key}: {n} begin(s) without end")
    for track, items in slices.items():
        items.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        stack: list[tuple[float, float, str]] = []
        for start, end, name in items:
            while stack and stack[-1][1] <= start + EPS_US:
                stack.pop()
            if stack and end > stack[-1][1] + EPS_US:
                problems.append(f"track {track}: {name!r} [{start}, {end}] overlaps "
                                f"{stack[-1][2]!r} without nesting")
            stack.append((start, end, name))
    return problems


def slices_of(trace: dict, pid: int) -> list[dict]:
    """The complete events of process ``pid``, by start time."""
    out = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("pid") == pid]
    return sorted(out, key=lambda e: (e["ts"], -e["dur"]))


def inside(child: dict, parent: dict) -> bool:
    return (parent["ts"] - EPS_US <= child["ts"]
            and child["ts"] + child["dur"] <= parent["ts"] + parent["dur"] + EPS_US)
