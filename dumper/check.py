"""``probe dump --task check``: the API precision check during the run, no tensor written.

Each recorded API call of the selected steps is replayed the moment it returns, on the golden
backend in higher precision, from its live inputs (as they were at the call: an in-place call,
whose input is gone, is skipped as the offline check skips it), and graded against its
standard (:mod:`probe.checker.replay`). Module calls (``--level mix``) only name the module each
call ran in. Results go to ``OUT/check/rank{R}/check_api.csv``, ``check_api.parquet`` and
``summary.json`` (the columns and summary of ``probe check-api``), rewritten at the end of
every selected step, so a crash loses at most the step in flight.

>>> from probe.dumper.config import DumpConfig
>>> DumpConfig(task="check", level="api", golden="cpu-fp64").golden
'cpu-fp64'
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterable

from probe.checker.replay import check_call, golden as golden_backend
from probe.checker.report import summarise, write
from probe.dumper.recorder import DumpRecorder


class CheckRecorder(DumpRecorder):
    """The :class:`~probe.engine_adapter.base.HookSink` of the ``check`` task (module docstring)."""

    def __init__(self, adapter: Any, config: Any, *, rank: int | None = None, store: Any = None) -> None:
        super().__init__(adapter, config, rank=rank, store=store)
        self.gold = golden_backend(config.golden)
        self.rows: list[dict] = []
        self.seconds = 0.0
        self._steps_done: list[int] = []

    def _reset(self) -> None:
        super()._reset()
        self.pending: dict[str, tuple] = {}

    @property
    def folder(self) -> Path:
        return Path(self.config.out) / "check" / f"rank{self.rank}"

    # ----------------------------------------------------------------- steps
    def end_step(self) -> None:
        if self.active:
            self._steps_done.append(self.step)
            self.drain()
        self.active = False
        self._reset()

    @property
    def steps_written(self) -> list[int]:
        return list(self._steps_done)

    def drain(self) -> None:
        """Write the results of every checked step."""
        if not self.rows and not self._steps_done:
            return
        try:
            summary = summarise(self.rows, golden=self.gold.name, source=f"online, rank {self.rank}",
                                seconds=self.seconds)
            summary["steps"] = list(self._steps_done)
            write(self.rows, summary, self.folder)
        except Exception as e:  # noqa: BLE001 - never kill training
            self.report_error("writing the check results", e)

    # ----------------------------------------------------------------- modules: names only
    def module_forward_pre(self, base: str, module_key: int, args: tuple, kwargs: dict) -> str | None:
        if not self.active or (self._filtered and not self.include(base)):
            return None
        try:
            return self.tree.module_call(base, module_key)
        except Exception as e:  # noqa: BLE001
            self.report_error("a module forward pre-hook", e)
            return None

    def module_forward(self, name: str, module_key: int, output: Any, params: Iterable[tuple[str, Any]]) -> None:
        if name is not None and self.active:
            self.tree.module_return(name)

    def module_backward(self, name: str, module_key: int, grad_outputs: Any, grad_inputs: Any) -> None:
        return None

    def parameter_grad(self, base: str, module_key: int, param_name: str, grad: Any, expected: int) -> None:
        return None

    # ----------------------------------------------------------------- APIs: replayed and graded
    def _api_started(self, name: str, kind: str, api: str, args: tuple, kwargs: dict) -> None:
        self.pending[name] = (api, args, kwargs)

    def api_return(self, token: Any, output: Any) -> None:
        if token is None or not self.active:
            return
        try:
            name = token[0]
            api, args, kwargs = self.pending.pop(name)
            started = time.perf_counter()
            row = check_call(api, list(args), dict(kwargs), output if isinstance(output, (tuple, list)) else [output],
                             self.gold)
            self.seconds += time.perf_counter() - started
            row.update(step=self.step, rank=self.rank, order=self.tree.node_info[name][2], name=name,
                       parent=self.tree.construct.get(name))
            self.rows.append(row)
        except Exception as e:  # noqa: BLE001
            self.report_error("an API check", e)

    def api_backward(self, token: Any, grad_outputs: Any, grad_inputs: Any) -> None:
        return None


def summarise_run(out: str, options: dict[str, Any], code: int) -> None:
    """The closing lines of ``probe dump --task check`` and ``OUT/dump_summary.json``."""
    import json

    import click
    import pyarrow.parquet as pq

    from probe.checker.report import CHECK_VERDICTS, first_failure, format_summary, format_table

    root = Path(out)
    rows: list[dict] = []
    for f in sorted(root.glob("check/rank*/check_api.parquet")):
        rows += pq.read_table(f).to_pylist()
    golden = options.get("golden", "cpu-fp64")
    summary = summarise(rows, golden=golden, source=str(root))
    doc = {"out": str(root), "level": options["level"], "task": "check", "exit_code": code,
           "steps": sorted({r["step"] for r in rows}), "ranks": sorted({r["rank"] for r in rows}),
           "calls": len(rows), "counts": summary["counts"], "first_failure": first_failure(rows),
           "results": sorted(str(p.parent) for p in root.glob("check/rank*/summary.json"))}
    if root.is_dir():
        (root / "dump_summary.json").write_text(json.dumps(doc, indent=1, default=str))
    if not rows:
        click.echo(f"probe dump: no API call was checked in {out}", err=True)
        return
    click.echo(format_table(rows, 10))
    click.echo("probe dump: check: " + format_summary(summary))
    click.echo(f"  results: {out}/check/rank{{R}}/check_api.csv, check_api.parquet, summary.json "
               f"({', '.join(v for v in CHECK_VERDICTS if summary['counts'][v])})")
