"""Resolve a compare input (dump.json, step/rank folder, or run folder with a store) to records.

>>> d = load_dump("/work/shared/data/msprobe/torch_L0")      # doctest: +SKIP
>>> d.source, d.tensors.num_rows                            # doctest: +SKIP
('/work/shared/data/msprobe/torch_L0/step0/proc0/dump.json', 99)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from probe.errors import ProbeError

__all__ = ["Dump", "load_dump", "load_pair"]

# Inputs of at least this many bytes of dump.json together are read in two processes at once.
PARALLEL_BYTES = 64 << 20


@dataclass
class Dump:
    """One side of a comparison: its tensor and node records and where they came from."""

    source: str
    tensors: pa.Table
    nodes: pa.Table
    framework: str | None = None
    task: str | None = None
    step: int | None = None
    rank: int | None = None
    note: str | None = None


def load_dump(path: str | os.PathLike) -> Dump:
    """Read one compare input into records; one-line :class:`ProbeError` on bad input.

    A folder is searched for ``dump.json`` files first (the lowest step, then rank, is taken
    and the choice is noted); a folder without any but with ``store/`` is read from the store.
    """
    from collectors.msprobe_reader import find_dump_files, read_msprobe_dump

    p = Path(path)
    if not p.exists():
        raise ProbeError(f"{p}: no such file or folder")
    note = None
    if p.is_dir() and p.name == "store" and (p / "tensor").is_dir():
        return _load_store(p.parent)
    if p.is_dir():
        files = find_dump_files(p)
        if not files:
            if (p / "store").is_dir():
                return _load_store(p)
            raise ProbeError(f"{p}: no dump.json under it and no store/ folder; give a dump.json, "
                             "a step/rank folder or a run folder")
        if len(files) > 1:
            note = (f"{p} holds {len(files)} dumps; comparing the first "
                    f"({files[0].relative_to(p).parent}); give a step/rank folder to choose")
        p = files[0]
    d = read_msprobe_dump(p)
    return Dump(source=d.path, tensors=d.tensors, nodes=d.nodes, framework=d.framework,
                task=d.task, step=d.step, rank=d.rank, note=note)


def load_pair(a: str | os.PathLike, b: str | os.PathLike) -> tuple[Dump, Dump]:
    """Read both compare inputs: ``(load_dump(a), load_dump(b))``, B in a forked worker process
    while A is read here when the two dump.json files are large (reading is CPU-bound Python and
    Arrow work, one core per side). Errors are those of :func:`load_dump`, A's first.

    >>> da, db = load_pair("runs/A/dump.json", "runs/B/dump.json")  # doctest: +SKIP
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    if (os.cpu_count() or 1) < 2 or _json_bytes(a) + _json_bytes(b) < PARALLEL_BYTES \
            or "fork" not in multiprocessing.get_all_start_methods():
        return load_dump(a), load_dump(b)
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("fork")) as pool:
        fb = pool.submit(load_dump, b)
        try:
            da = load_dump(a)
        except BaseException:
            fb.cancel()
            raise
        try:
            db = fb.result()
        except ProbeError:
            raise
        except Exception:  # the worker died or its result did not come back: read B here
            db = load_dump(b)
    return da, db


def _json_bytes(path: str | os.PathLike) -> int:
    """Size of the dump.json that :func:`load_dump` would read from ``path`` (0 if none)."""
    from collectors.msprobe_reader import find_dump_files

    p = Path(path)
    try:
        files = find_dump_files(p) if p.exists() else []
        return files[0].stat().st_size if files else 0
    except OSError:
        return 0


def _load_store(root: Path) -> Dump:
    from collectors.store import open_store, read_step

    con = open_store(root)
    tensors, nodes, step, rank = read_step(root, con=con)
    ranks = con.sql("select count(distinct rank), count(distinct step) from tensors").fetchall()[0]
    note = None
    if ranks[0] > 1 or ranks[1] > 1:
        note = f"{root}: store holds {ranks[1]} steps × {ranks[0]} ranks; comparing step {step} rank {rank}"
    return Dump(source=str(root / "store"), tensors=tensors, nodes=nodes, step=step, rank=rank,
                note=note, task="statistics")
