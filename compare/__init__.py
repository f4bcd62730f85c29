"""Compare: load two dumps, normalise, match, compute metrics, give verdicts and localise.

The public entry point is :func:`probe.compare.api.compare` (``probe compare A B`` on the command
line), which returns a :class:`probe.compare.result.CompareResult`; ``pipeline`` calls the
modules' stages, each taking and returning Arrow tables (``tables``: lent to DuckDB for the
length of a stage), in pipeline order:

- ``load``: resolve an input (dump.json, step/rank folder, run folder with ``store/``);
- ``normalise``: framework-free names, dtypes, parameter and class names (DuckDB SQL);
- ``mapping``: msprobe's layer/cell/API/data mapping files;
- ``match``: exact names, mapping pairs, structural alignment, nearest common ancestors;
- ``tensor_rows``: statistics metrics and per-tensor verdicts (DuckDB SQL);
- ``metrics``: element-wise metrics of tensor-mode dumps;
- ``node_rows``: per-node pairs and verdicts (DuckDB SQL);
- ``verdict``: dtype-aware tolerances and the verdict ladder (SQL and NumPy); ``localise``:
  first divergence and first NaN/Inf;
- ``report``: summary.json, the output files and the terminal summary.

``ranks`` compares two runs of several ranks pair by pair, on local processes or a Dask
distributed cluster (``probe compare RUN_A RUN_B``, :func:`probe.compare.ranks.compare_runs`).
"""

import sys as _sys
import types as _types


class _CallableRoom(_types.ModuleType):
    """``probe.compare`` is both this room and the function of the public API:
    ``probe.compare(a, b, ...)`` is :func:`probe.compare.api.compare`.

    >>> import probe
    >>> callable(probe.compare), probe.compare.__name__
    (True, 'probe.compare')
    """

    def __call__(self, a: str, b: str, **options):
        from probe.compare.api import compare

        return compare(a, b, **options)


_sys.modules[__name__].__class__ = _CallableRoom
