"""``probe origin``: where a NaN, an Inf or a blow-up began, from every rank's flight-recorder ring.

A flight recorder (``--flight-recorder K``, :mod:`probe.dumper.flight`) writes each rank's last
K steps as an ordinary dump when it fires, and ``RUN/flight_recorder/rank{R}.json`` beside it
names the steps. Every tensor record of every rank is placed by ``(step, position, rank)``: the
step; the position of its call in the step's execution order (a rank's ring dump lists the calls
as they ran: the forward's as they returned, then the backward's as autograd ran them; an API
call made inside the backward pass, at mix level, where it ran); the rank last. The origin is the first record that is

- **non-finite**: a NaN or an Inf in it (its statistics or counts; an Inf that every record of
  the tensor holds alike, on every rank and step, is an attention mask's -inf, not trouble), or
- **an outlier**: its largest magnitude ``max(|max|, |min|)`` at least :data:`OUTLIER_DECADES`
  orders of magnitude above its usual one, the median of the same tensor in the ring's earlier
  steps on that rank and in the same step on the other ranks (at least two values).

Ranks run the same calls in the same order, so positions line up across ranks: a NaN born in
rank 3's forward at step 40 is ahead of the NaN the gradient all-reduce spreads into every
rank's step-40 update (seen in their step-41 forward) and of anything in its backward; the
origin is rank 3's record. Nothing here imports torch.

>>> _decades(1.0, [0.001, 0.002, 0.0015]) >= OUTLIER_DECADES
True
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from probe.ground.errors import ProbeError
from probe.ground.selection import format_selection

#: the flight recorder's markers under a run folder (probe.dumper.flight_write.MARKER_DIR)
MARKER_DIR = "flight_recorder"
#: orders of magnitude above its usual size at which a tensor is an outlier
OUTLIER_DECADES = 2.0
_MODULE_NAME = re.compile(r"^(?:Module|Cell)\.(?P<path>.+)\.(?P<cls>[^.]+)\.(?P<what>forward|backward|parameters_grad)\.(?P<n>\d+)$")
_API_NAME = re.compile(r"^(?P<api>.+)\.(?P<n>\d+)\.(?P<what>forward|backward)$")


@dataclass
class Record:
    step: int
    phase: int           # 0 forward, 1 backward (by its name)
    position: int        # the call's place in the step's execution order
    rank: int
    node: str
    tensor: str          # output.0, input.0, parameters_grad.weight
    order: int           # the tensor's place within its call
    max: float
    min: float
    norm: float
    nan: int
    inf: int

    @property
    def key(self) -> tuple:
        return (self.step, self.position, self.order, self.rank)

    @property
    def magnitude(self) -> float:
        return max(abs(self.max), abs(self.min))

    @property
    def nonfinite(self) -> bool:
        return self.nan > 0 or self.inf > 0 or not all(math.isfinite(v) for v in (self.max, self.min, self.norm))


def find_origin(run: str | os.PathLike) -> dict[str, Any]:
    """``{"step", "rank", "module", "direction", "tensor", "evidence"}`` (and ``node``, ``cause``)
    of the first non-finite or outlying record of ``run``'s rings; all but ``evidence`` are None
    when there is none. A ProbeError when ``run`` holds no ring."""
    root = Path(run)
    if not root.is_dir():
        raise ProbeError(f"{run}: not a run folder (give the --out of a run with --flight-recorder K)")
    markers = _markers(root)
    records, steps = _records(root, markers)
    if not records:
        raise ProbeError(f"{run}: the flight recorder's markers name no readable ring dump "
                         f"(step{{N}}/rank{{R}}/dump.json)")
    ranks = sorted(markers)
    triggers = sorted({m.get("reason", "") for m in markers.values() if m.get("reason")})
    span = f"steps {min(steps)}-{max(steps)}" if len(steps) > 1 else f"step {min(steps)}"
    context = (f"the rings of {len(ranks)} rank{'s' if len(ranks) != 1 else ''} ({span})"
               + (f"; trigger: {triggers[0]}" if triggers else ""))
    records.sort(key=lambda r: r.key)
    masks = _masks(records)
    first_bad = next((r for r in records if r.nonfinite and (r.node, r.tensor) not in masks), None)
    outlier = _first_outlier(records, before=first_bad.key if first_bad else None)
    found = outlier[0] if outlier is not None else first_bad
    if found is None:
        return {"step": None, "rank": None, "module": None, "direction": None, "tensor": None,
                "node": None, "cause": None,
                "evidence": f"no non-finite value and no outlier in {context}"}
    module, direction = _module_of(found.node)
    where = f"{found.tensor} of {found.node} on rank {found.rank} at step {found.step}"
    if outlier is not None:
        usual, told = outlier[1], outlier[2]
        cause = "outlier"
        what = (f"{where} reaches |x| = {found.magnitude:.3g}, {found.magnitude / usual:.3g}x its usual "
                f"{usual:.3g} ({told})")
    else:
        cause = "nan" if found.nan or any(v != v for v in (found.max, found.min, found.norm)) else "inf"
        what = f"{where} holds {_counts(found)}"
    later = _spread(records, found)
    evidence = (f"{what}: the first {'outlier' if cause == 'outlier' else 'non-finite value'} in "
                f"execution order (forward in call order, then backward) across {context}"
                + (f"; {later}" if later else "") + ".")
    return {"step": found.step, "rank": found.rank, "module": module, "direction": direction,
            "tensor": found.tensor, "node": found.node, "cause": cause, "evidence": evidence}


def _masks(records: list[Record]) -> set[tuple[str, str]]:
    """The tensors whose Infs are structure, not trouble: an Inf (no NaN) in every record of
    the tensor, the same count on every rank and step (an attention mask of -inf, seen at mix
    level in ``Torch.full`` and the additions that apply it), at least twice."""
    seen: dict[tuple[str, str], list] = {}
    for r in records:
        s = seen.setdefault((r.node, r.tensor), [0, set(), False])
        s[0] += 1
        s[1].add(r.inf)
        s[2] = s[2] or r.nan > 0 or any(v != v for v in (r.max, r.min, r.norm))
    return {key for key, (n, infs, nan) in seen.items() if n >= 2 and not nan and len(infs) == 1 and 0 not in infs}


def _markers(root: Path) -> dict[int, dict]:
    folder = root / MARKER_DIR
    found: dict[int, dict] = {}
    if folder.is_dir():
        for path in sorted(folder.glob("rank*.json")):
            m = re.fullmatch(r"rank(\d+)\.json", path.name)
            if m is None or not path.is_file():
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                raise ProbeError(f"{path}: unreadable flight-recorder marker") from None
            if not isinstance(data, dict) or not isinstance(data.get("steps"), list):
                raise ProbeError(f"{path}: not a flight-recorder marker (no steps list)")
            found[int(m.group(1))] = data
    if not found:
        raise ProbeError(f"{root}: no flight-recorder ring dump here ({MARKER_DIR}/rank*.json); "
                         "run with --flight-recorder K (a ring is written when a trigger fires)")
    return found


def _records(root: Path, markers: dict[int, dict]) -> tuple[list[Record], set[int]]:
    records: list[Record] = []
    steps: set[int] = set()
    for rank, marker in markers.items():
        wanted = set()
        for t in marker.get("triggers", []) or [marker]:
            wanted.update(int(s) for s in t.get("steps", []) if isinstance(s, int))
        wanted.update(int(s) for s in marker["steps"] if isinstance(s, int))
        for step in sorted(wanted):
            path = root / f"step{step}" / f"rank{rank}" / "dump.json"
            if not path.is_file():
                continue
            try:
                data = json.loads(path.read_text(encoding="utf-8")).get("data", {})
            except (OSError, ValueError, AttributeError):
                raise ProbeError(f"{path}: unreadable dump.json") from None
            steps.add(step)
            for position, (node, entry) in enumerate(data.items()):
                if not isinstance(entry, dict):
                    continue
                phase = 0 if _is_forward(node) else 1
                for order, (tensor, value) in enumerate(_tensors(entry)):
                    records.append(Record(step, phase, position, rank, node, tensor, order,
                                          _float(value.get("Max")), _float(value.get("Min")),
                                          _float(value.get("Norm")), int(value.get("nan_count", 0) or 0),
                                          int(value.get("inf_count", 0) or 0)))
    return records, steps


def _is_forward(node: str) -> bool:
    return node.endswith(".forward") or ".forward." in node


def _tensors(entry: dict):
    """``(label, statistics)`` of each tensor of an msprobe entry, in its order."""
    if "input_args" in entry or ("output" in entry and "input" not in entry):
        for i, v in enumerate(entry.get("output") or []):
            if isinstance(v, dict) and "Max" in v:
                yield f"output.{i}", v
        return
    if "input" in entry or "output" in entry:
        for key in ("input", "output"):
            for i, v in enumerate(entry.get(key) or []):
                if isinstance(v, dict) and "Max" in v:
                    yield f"{key}.{i}", v
        return
    for pname, values in entry.items():
        for v in values if isinstance(values, list) else [values]:
            if isinstance(v, dict) and "Max" in v:
                yield f"parameters_grad.{pname}", v


def _float(v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    return math.nan


def _decades(value: float, usual: list[float]) -> float:
    """How many orders of magnitude ``value`` is above the median of ``usual``."""
    base = sorted(u for u in usual if u > 0 and math.isfinite(u))
    if len(base) < 2 or not value > 0:
        return 0.0
    n = len(base)
    median = base[n // 2] if n % 2 else math.sqrt(base[n // 2 - 1] * base[n // 2])
    return math.log10(value) - math.log10(median)


def _first_outlier(records: list[Record], before: tuple | None) -> tuple[Record, float, str] | None:
    """The first record (in order, before ``before``) far above its usual size, with that size
    and where it was read."""
    series: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    for r in records:
        if not r.nonfinite:
            series.setdefault((r.node, r.tensor), {})[(r.rank, r.step)] = r.magnitude
    for r in records:
        if before is not None and r.key >= before:
            return None
        if r.nonfinite:
            continue
        values = series[(r.node, r.tensor)]
        earlier = {s: v for (rank, s), v in values.items() if rank == r.rank and s < r.step}
        others = {rank: v for (rank, s), v in values.items() if s == r.step and rank != r.rank}
        usual = list(earlier.values()) + list(others.values())
        if _decades(r.magnitude, usual) >= OUTLIER_DECADES:
            base = sorted(u for u in usual if u > 0)
            n = len(base)
            median = base[n // 2] if n % 2 else math.sqrt(base[n // 2 - 1] * base[n // 2])
            told = []
            if earlier:
                told.append(f"steps {format_selection(sorted(earlier))} of rank {r.rank}")
            if others:
                told.append(f"ranks {format_selection(sorted(others))} at step {r.step}")
            return r, median, "median of " + " and ".join(told)
    return None


def _spread(records: list[Record], found: Record) -> str:
    """Where the other ranks first show a non-finite value, in words ('' when none do)."""
    firsts: dict[int, Record] = {}
    for r in records:
        if r.rank != found.rank and r.rank not in firsts and r.nonfinite:
            firsts[r.rank] = r
    if not firsts:
        return ""
    parts = []
    for rank in sorted(firsts):
        r = firsts[rank]
        parts.append(f"rank {rank} at step {r.step} {'forward' if r.phase == 0 else 'backward'} ({r.node})")
    return "the other ranks turn non-finite only later: " + ", ".join(parts)


def _counts(r: Record) -> str:
    bits = []
    if r.nan:
        bits.append(f"{r.nan} NaN")
    if r.inf:
        bits.append(f"{r.inf} Inf")
    if not bits:
        bits.append("a non-finite statistic")
    return " and ".join(bits) + f" (max {r.max}, min {r.min})"


def _module_of(node: str) -> tuple[str, str]:
    """``(module path or API name, direction)`` of a dump name."""
    m = _MODULE_NAME.match(node)
    if m:
        return m.group("path"), "forward" if m.group("what") == "forward" else "backward"
    m = _API_NAME.match(node)
    if m:
        return m.group("api"), m.group("what")
    return node, "forward" if _is_forward(node) else "backward"

