"""The offline API precision check of a tensor dump: every recorded call replayed and graded.

>>> from probe.checker.offline import check_dump                      # doctest: +SKIP
>>> rows, summary = check_dump("runs/dump", golden="cpu-fp64")  # doctest: +SKIP
>>> summary["first_failure"]["name"]                            # doctest: +SKIP
'Functional.linear.3.forward'
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from probe.checker.calls import TensorFiles, find_steps, materialise, read_calls
from probe.checker.replay import check_call, golden as golden_backend, row_for
from probe.checker.report import summarise
from probe.ground.errors import ProbeError


def check_dump(root: str | os.PathLike, *, golden: str = "cpu-fp64",
               progress: bool = False) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Replay and grade every API call of the dump under ``root``; returns the rows and the
    summary (see :mod:`probe.checker.report`)."""
    gold = golden_backend(golden)
    started = time.perf_counter()
    steps = find_steps(root)
    loaded = [(step, rank, folder, *read_calls(folder, step, rank)) for step, rank, folder in steps]
    total = sum(len(calls) for *_, calls, _ in loaded)
    if total == 0:
        raise ProbeError(f"{root}: the dump records no API call; dump with --level api or mix")
    if all(header.get("task") not in ("tensor", None) for *_, header in loaded):
        raise ProbeError(f"{root}: a {loaded[0][-1].get('task')} dump holds no tensors to replay; "
                         "dump with --task tensor --level api (or mix)")
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=total, desc="check-api", unit="call", file=sys.stderr, leave=False)
    rows = []
    for step, rank, folder, calls, header in loaded:
        files = TensorFiles(folder, header)
        for call in calls:
            base = {"step": step, "rank": rank, "order": call.order, "name": call.name, "parent": call.parent}
            try:
                args, missing = materialise(call.args, files)
                kwargs, missing_k = materialise(call.kwargs, files)
                outputs, missing_o = materialise(call.outputs, files)
                row = check_call(call.api, args, kwargs, outputs, gold, missing=missing or missing_k or missing_o)
            except ProbeError as e:
                row = row_for(call.api, "skipped", f"not replayable: {e}")
            rows.append({**row, **base})
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return rows, summarise(rows, golden=gold.name, source=str(root),
                           seconds=time.perf_counter() - started)
