"""msprobe's mapping files, read as msprobe reads them, turned into call-group pairs.

The kind is recognised from the content:

- **layer mapping** (``layer_mapping.yaml``): ``{TypeName: {child_in_A: child_in_B}}``; a
  module path of A is rewritten scope by scope, each child renamed by the mapping of its
  parent's class (``TopLayer``, or the old ``Cell``, for the root); keys may span several
  levels (``a.b.c: new_c``);
- **cell mapping**: ``{"path.Class" in A: "path.Class" in B}`` (whole name, else substring
  replacement, as msprobe does);
- **API mapping**: a list of ``{ms_api: ..., pt_api: ...}``; the k-th call of ``ms_api`` in A
  pairs with the k-th call of ``pt_api`` in B;
- **data mapping**: ``{tensor name in A: tensor name in B}`` (``Cell.fc1.Dense.forward.0.input.0``).

A mapping that names nothing present in A is an error naming the file.

>>> kind_of({"TopLayer": {"network": "module"}}), kind_of([{"ms_api": "x", "pt_api": "y"}])
('layer', 'api')
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa

from probe.ground.errors import ProbeError
from probe.ground.files import read_regular

__all__ = ["mapped_pairs", "kind_of", "load_mapping"]

_ENTRY_RE = re.compile(r"^(.*?\.(?:forward|backward|parameters_grad)\.\d+|.*?\.\d+\.(?:forward|backward))(?:\.|$)")


#: A mapping file larger than this is refused (msprobe's are a few KB to a few MB).
MAX_MAPPING_BYTES = 64 << 20
#: Nesting deeper than this is refused (a layer mapping, the deepest kind, nests three levels).
MAX_MAPPING_DEPTH = 32


def load_mapping(path: str) -> Any:
    """Read a mapping YAML; one-line :class:`ProbeError` if unreadable.

    The file is bounded before it is built into Python objects: at most
    :data:`MAX_MAPPING_BYTES`, UTF-8 text (a binary file is named as such), nested at most
    :data:`MAX_MAPPING_DEPTH` levels, and without YAML aliases (``*name``), which msprobe's
    mapping files never use and which can make a few hundred bytes expand to gigabytes.

    >>> load_mapping("layer_mapping.yaml")                       # doctest: +SKIP
    {'TopLayer': {'network_with_loss': 'module'}}
    """
    import yaml

    p = Path(path)
    if not p.exists():
        raise ProbeError(f"{p}: no such mapping file")
    try:
        size = p.stat().st_size
        if size > MAX_MAPPING_BYTES:
            raise ProbeError(f"{p}: the mapping file is {size >> 20} MB; a mapping YAML is at most "
                             f"{MAX_MAPPING_BYTES >> 20} MB (is this the right file?)")
        raw = read_regular(p, MAX_MAPPING_BYTES)
    except OSError as e:
        raise ProbeError(f"{p}: cannot read the mapping file ({e.strerror})") from None
    text = _text(p, raw)
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_nodes(p, node)
        doc = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as e:
        raise ProbeError(f"{p}: unreadable mapping YAML ({_yaml_problem(e)})") from None
    except RecursionError:
        raise ProbeError(f"{p}: the mapping YAML nests too deeply to be a mapping file") from None
    except ValueError as e:                          # a number of thousands of digits
        raise ProbeError(f"{p}: a number out of range in the mapping YAML ({str(e).split(':')[0]})") from None
    finally:
        loader.dispose()
    if not doc:
        raise ProbeError(f"{p}: the mapping file is empty")
    return doc


def _yaml_problem(e: Any) -> str:
    """A YAML error in a few words, with its line when known."""
    problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e).splitlines()[0]
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    return f"{problem} at line {mark.line + 1}" if mark is not None else str(problem)


def _text(p: Path, raw: bytes) -> str:
    """The file's bytes as text, or a :class:`ProbeError` naming a binary file."""
    if b"\0" in raw[:65536]:
        raise ProbeError(f"{p}: a binary file (it holds NUL bytes), not a YAML mapping file")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ProbeError(f"{p}: not UTF-8 text (byte {e.start}); a binary file is not a YAML "
                         "mapping file") from None


def _check_nodes(p: Path, root: Any) -> None:
    """Refuse aliases (a node reached twice) and nesting deeper than :data:`MAX_MAPPING_DEPTH`,
    walking the composed node graph once (before anything is expanded)."""
    seen: set[int] = set()
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if id(node) in seen:
            line = node.start_mark.line + 1 if node.start_mark is not None else "?"
            raise ProbeError(f"{p}: line {line}: a YAML anchor (&name) used again through an alias "
                             "(*name); a mapping file may not use aliases, write each entry out")
        seen.add(id(node))
        if depth > MAX_MAPPING_DEPTH:
            raise ProbeError(f"{p}: the mapping YAML nests deeper than {MAX_MAPPING_DEPTH} levels; "
                             "not a mapping file")
        if isinstance(node.value, list):
            for item in node.value:
                for child in (item if isinstance(item, tuple) else (item,)):
                    stack.append((child, depth + 1))


def kind_of(doc: Any) -> str:
    """``layer``, ``cell``, ``api`` or ``data`` (see the module docstring)."""
    if isinstance(doc, list):
        return "api"
    if isinstance(doc, dict):
        if all(isinstance(v, dict) for v in doc.values()):
            return "layer"
        keys = [k for k in doc if isinstance(k, str)]
        if keys and all(_ENTRY_RE.match(k) for k in keys):
            return "data"
        return "cell"
    return "unknown"


def mapped_pairs(groups_a: pa.Table, groups_b: pa.Table, path: str) -> pa.Table:
    """Pairs (grp_a, grp_b, reason) that the mapping file gives, resolved in both sides' call
    groups (:attr:`probe.compare.normalise.Side.groups`)."""
    doc = load_mapping(path)
    kind = kind_of(doc)
    ga, gb = _rows(groups_a), _rows(groups_b)
    if kind == "layer":
        pairs = _layer(doc, ga, gb)
    elif kind == "cell":
        pairs = _cell({str(k): str(v) for k, v in doc.items()}, ga, gb)
    elif kind == "api":
        pairs = _api(doc, ga, gb)
    elif kind == "data":
        pairs = _data({str(k): str(v) for k, v in doc.items()}, ga, gb)
    else:
        raise ProbeError(f"{path}: not an msprobe mapping (expected a layer/cell/data mapping "
                         "object or an API mapping list)")
    if not pairs:
        raise ProbeError(f"{path}: the {kind} mapping names nothing that exists in A and B; "
                         "check the names against the dumps' dump.json")
    return pa.table({"grp_a": [p[0] for p in pairs], "grp_b": [p[1] for p in pairs],
                     "reason": [f"{kind} mapping {Path(path).name}" for _ in pairs]})


def _rows(groups: pa.Table) -> list[tuple]:
    """The call groups as tuples of the columns the mappings read, in the table's order."""
    cols = ("grp", "kind", "prefix", "path", "cls", "call", "fwd", "bwd", "pgrad", "ord_f")
    return list(zip(*(groups.column(c).to_pylist() for c in cols)))


def _unique(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    seen_a, seen_b, out = set(), set(), []
    for a, b in pairs:
        if a not in seen_a and b not in seen_b:
            seen_a.add(a)
            seen_b.add(b)
            out.append((a, b))
    return out


def _modules(groups: list[tuple]) -> dict[tuple[str, int], str]:
    return {(g[3], g[5] or 0): g[0] for g in groups if g[1] == "module"}


def _layer(doc: dict, ga: list[tuple], gb: list[tuple]) -> list[tuple[str, str]]:
    mapping: dict[str, dict[str, list[tuple[str, str, int]]]] = {}
    for type_name, names in doc.items():
        key = "TopLayer" if type_name == "Cell" else str(type_name)
        for origin, target in (names or {}).items():
            origin, target = str(origin), str(target).split("(")[0]
            mapping.setdefault(key, {}).setdefault(origin.split(".")[0], []).append(
                (origin, target, len(origin.split("."))))
    for rules in mapping.values():
        for lst in rules.values():
            lst.sort(key=lambda r: -r[2])
    cls_of = {g[3]: g[4] for g in ga if g[1] == "module"}
    b_mod = _modules(gb)
    pairs = []
    for g in ga:
        if g[1] != "module":
            continue
        parts = g[3].split(".") if g[3] else []
        new, i, scope_type = [], 0, "TopLayer"
        while i < len(parts):
            step, name = 1, parts[i]
            for origin, target, level in mapping.get(scope_type, {}).get(parts[i], []):
                if ".".join(parts[i:i + level]) == origin:
                    step, name = level, target
                    break
            new.append(name)
            i += step
            scope_type = cls_of.get(".".join(parts[:i]), parts[i - 1])
        b = b_mod.get((".".join(new), g[5] or 0))
        if b is not None and new != parts:
            pairs.append((g[0], b))
    return _unique(pairs)


def _cell(doc: dict[str, str], ga: list[tuple], gb: list[tuple]) -> list[tuple[str, str]]:
    b_by_name = {(f"{g[3]}.{g[4]}" if g[3] else g[4], g[5] or 0): g[0] for g in gb if g[1] == "module"}
    pairs = []
    for g in ga:
        if g[1] != "module":
            continue
        cell = f"{g[3]}.{g[4]}" if g[3] else g[4]
        if cell in doc:
            new = doc[cell]
        else:
            new = cell
            for k, v in doc.items():
                if k in new:
                    new = new.replace(k, v, 1)
        if new != cell and (new, g[5] or 0) in b_by_name:
            pairs.append((g[0], b_by_name[(new, g[5] or 0)]))
    return _unique(pairs)


def _api(doc: list, ga: list[tuple], gb: list[tuple]) -> list[tuple[str, str]]:
    def calls(groups: list[tuple], api: str) -> list[str]:
        sel = [g for g in groups if g[1] != "module" and f"{g[2]}.{g[3]}" == api]
        return [g[0] for g in sorted(sel, key=lambda g: (g[9] is None, g[9]))]
    pairs = []
    for item in doc:
        if not isinstance(item, dict) or "ms_api" not in item or "pt_api" not in item:
            continue
        pairs.extend(zip(calls(ga, str(item["ms_api"])), calls(gb, str(item["pt_api"]))))
    return _unique(pairs)


def _data(doc: dict[str, str], ga: list[tuple], gb: list[tuple]) -> list[tuple[str, str]]:
    def by_entry(groups: list[tuple]) -> dict[str, str]:
        out = {}
        for g in groups:
            for name in (g[6], g[7], g[8]):
                if name:
                    out[name] = g[0]
        return out
    ea, eb = by_entry(ga), by_entry(gb)
    pairs = []
    for ka, kb in doc.items():
        ma, mb = _ENTRY_RE.match(ka), _ENTRY_RE.match(kb)
        if ma and mb and ma.group(1) in ea and mb.group(1) in eb:
            pairs.append((ea[ma.group(1)], eb[mb.group(1)]))
    return _unique(pairs)
