"""``probe repro``: one divergence of a compare turned into a folder that runs with torch and
safetensors alone.

:func:`make_repro` reads a ``probe compare --out`` folder (``summary.json``, ``nodes.parquet``,
``compare.parquet``), picks the node (the first divergence, or the one named), finds each side's
dump, and writes into ``out``:

- ``a/`` and ``b/``: the node's inputs (``inputs.safetensors``), its parameters and those of the
  modules inside it (``params.safetensors``), its recorded outputs (``outputs.safetensors``),
  taken from the tensor dump, or, when the runs were dumped with statistics only, from a
  targeted re-run of that step with a tensor dump scoped to the module
  (:mod:`probe.checker.repro_sources`); and the code that builds the module
  (:mod:`probe.checker.repro_code`: the bundled engine's source and config; for a user's script
  its class with the constructor arguments read off the module, and a graph exported with
  ``torch.export``);
- ``repro.json``: the node on each side, how to build and call it, the output pairs the compare
  graded, its tolerance and its verdict and metrics;
- ``run.py`` (:mod:`probe.checker.repro_template`, which imports nothing of probe) and a
  ``README.md`` saying what came from where.

A node that is an API call (a mix- or api-level dump) is one call: ``run.py`` replays it on
each side's inputs, in the recorded dtype and in float64, as ``probe check-api`` does.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from probe.checker.repro_sources import Side, locate_compare, node_pair, read_side
from probe.ground.errors import ProbeError

log = logging.getLogger(__name__)

#: what ``probe repro`` writes into its ``--out`` folder
OUTPUTS = ["a", "b", "repro.json", "run.py", "README.md"]


@dataclass
class Repro:
    """What :func:`make_repro` wrote and how."""

    out: Path
    node_a: str
    node_b: str
    kind: str
    expected: dict
    sources: dict[str, str] = field(default_factory=dict)      # side -> "tensor dump" | "re-run"
    routes: dict[str, list[str]] = field(default_factory=dict)  # side -> how its module is built
    notes: list[str] = field(default_factory=list)


def make_repro(compare_dir: str | Path, out: str | Path, node: str | None = None, *,
               force: bool = False) -> Repro:
    """Write the reproducer of ``node`` (default: the compare's first divergence) into ``out``."""
    import pyarrow.parquet as pq

    from probe.checker.repro_code import module_routes, write_api
    from probe.ground.outdir import claim

    folder, summary = locate_compare(Path(compare_dir))
    nodes = pq.read_table(folder / "nodes.parquet").to_pylist()
    rows = pq.read_table(folder / "compare.parquet").to_pylist()
    row = node_pair(folder, summary, nodes, node)
    pair_rows = [r for r in rows if r["node_a"] == row["node_a"] and r["node_b"] == row["node_b"]
                 and r["direction"] == "forward"]
    outs = [r for r in pair_rows if r["slot"] == "output"]
    if not outs:
        if row.get("match_method") == "ancestor":
            raise ProbeError(f"{folder / 'nodes.parquet'}: {row['node_a']} has no counterpart of its own in B "
                             f"(compared within B's {row['node_b']}); reproduce a node matched in full, "
                             "such as that one's counterpart in A")
        raise ProbeError(f"{folder / 'compare.parquet'}: the node {row['node_a']} has no output the "
                         "compare graded; nothing to reproduce")
    out = claim(out, "repro", OUTPUTS, force=force)
    sides = {"a": read_side(folder, summary, "a", row["node_a"]),
             "b": read_side(folder, summary, "b", row["node_b"])}
    kinds = {s.kind for s in sides.values()}
    if len(kinds) != 1:
        raise ProbeError(f"{row['node_a']} is a {sides['a'].kind} and {row['node_b']} a {sides['b'].kind}; "
                         "repro needs a module on both sides or an API call on both")
    kind = kinds.pop()
    worst = max(outs, key=lambda r: (_SEVERITY.get(r["verdict"], 0), r["err"] if r["err"] is not None else 0.0))
    expected = {"verdict": worst["verdict"], "node_verdict": row["verdict"],
                "max_abs_error": worst["max_abs_err"], "max_rel_error": worst["max_rel_err"],
                "cosine": worst["cosine"], "err": worst["err"], "reason": worst["reason"],
                "tensor_a": worst["name_a"], "tensor_b": worst["name_b"]}
    result = Repro(out, row["node_a"], row["node_b"], kind, expected)
    spec_sides = {}
    for name, side in sides.items():
        side.gather(out / name)
        result.sources[name] = side.source
        if side.rerun_note:
            result.notes.append(side.rerun_note)
        if kind == "api":
            spec_sides[name] = {**write_api(side), "check_api": side.check}
            result.routes[name] = [f"the API {side.api} (check-api on a float64 golden: "
                                   f"{side.check['verdict']}, {side.check['reason']})"]
        else:
            routes = module_routes(side, out / name)
            spec_sides[name] = {"kind": "module", "node": side.node, "path": side.path, "class": side.cls,
                                "args": side.args_tree, "kwargs": side.kwargs_tree, "routes": routes,
                                "training": True}
            result.routes[name] = [_route_words(r) for r in routes]
        spec_sides[name]["node"] = side.node
        spec_sides[name]["args"], spec_sides[name]["kwargs"] = side.args_tree, side.kwargs_tree
        spec_sides[name]["source"] = side.source
        spec_sides[name]["autocast"] = side.autocast
    pairs = []
    for r in outs:
        ia, ib = sides["a"].output_index(r["index"]), sides["b"].output_index(r["index"])
        if ia is None or ib is None:
            continue
        pairs.append([ia, ib])
    if not pairs:
        raise ProbeError(f"{folder / 'compare.parquet'}: the outputs of {row['node_a']} the compare graded "
                         "are not in the dump's entry")
    spec = {"format": "probe-repro", "version": 1, "node": row["node_a"], "kind": kind,
            "compare": str(folder.resolve()), "direction": "forward",
            "expected": expected, "output_pairs": pairs,
            "tolerance": _tolerance(summary), "upstream": _upstream(row, summary),
            "sides": spec_sides}
    (out / "repro.json").write_text(json.dumps(spec, indent=1, default=str))
    shutil.copyfile(Path(__file__).with_name("repro_template.py"), out / "run.py")
    (out / "README.md").write_text(_readme(result, sides, spec))
    return result


_SEVERITY = {"pass": 0, "warning": 1, "error": 2, "nan": 3, "unmatched": -1}


def _tolerance(summary: dict) -> dict[str, list[float]]:
    """The compare's (pass, warning) bounds per dtype; the float ones the compare did not meet
    are taken from the one verdict ladder of :mod:`probe.compare.verdict`."""
    from probe.compare.verdict import TOLERANCES

    tol = {k: [float(v[0]), float(v[1])] for k, v in TOLERANCES.items()
           if isinstance(v, (tuple, list)) and len(v) == 2}
    for dtype, b in ((summary.get("tolerance") or {}).get("dtypes") or {}).items():
        tol[dtype] = [float(b["pass"]), float(b["warning"])]
    return tol


def _upstream(row: dict, summary: dict) -> str:
    """Where to look when the node's inputs carry the divergence: the origin the compare says
    affects this node, else the first divergence, else the producer of its inputs."""
    if row.get("affected_by_a"):
        return row["affected_by_a"]
    first = (summary.get("first_divergence") or {}).get("a")
    if first and first != row["node_a"]:
        return first
    return f"the calls that made the inputs of {row['node_a']}"


def _route_words(route: dict) -> str:
    if route["kind"] == "source":
        return f"{route['file']}: {route['what']}"
    if route["kind"] == "class":
        return f"class {route['module']}.{route['qualname']}({_call_args(route)})"
    return f"{route['file']}: the module exported with torch.export"


def _call_args(route: dict) -> str:
    parts = [repr(a) for a in route.get("args", [])] + [f"{k}={v!r}" for k, v in route.get("kwargs", {}).items()]
    return ", ".join(parts)


def _readme(result: Repro, sides: dict[str, Side], spec: dict) -> str:
    lines = [f"# Reproducer of {result.node_a}", "",
             f"Made by `probe repro` from the compare in `{spec['compare']}`.", "",
             "| side | node | dump | tensors from | module built from |", "|---|---|---|---|---|"]
    for name, side in sides.items():
        lines.append(f"| {name.upper()} | `{side.node}` | `{side.dump_dir}` | {side.source} | "
                     f"{'; or '.join(result.routes[name])} |")
    exp = result.expected
    metrics = (f"max abs error {exp['max_abs_error']}, max rel error {exp['max_rel_error']}, cosine {exp['cosine']}"
               if exp["max_abs_error"] is not None else "a compare of statistics: no element-wise metrics")
    lines += ["", f"The compare graded its output `{exp['verdict']}` ({exp['reason'] or 'agrees'}); {metrics}.", "",
              "Needs only `torch` and `safetensors`:", "", "```",
              "python run.py                # exit 1: the divergence reproduces; 0: it does not",
              "python run.py --json         # {\"node\", \"verdict\", \"max_abs_error\", \"max_rel_error\", \"cosine\"}",
              "python run.py --swap-inputs  # is it the module, or the inputs it was given?", "```"]
    for name, side in sides.items():
        if side.faults:
            lines += ["", f"Side {name.upper()} ran with planted faults: {', '.join(side.faults)} "
                      "(a weight fault is in the parameters here; a hook fault such as nan/perturb is not code "
                      "of the module and is not reproduced)."]
    for note in result.notes:
        lines += ["", note]
    return "\n".join(lines) + "\n"
