"""The nodes of an msprobe dump: each entry's kind, direction and class, and the module tree.

- :func:`classify_entries`: kind (module|api|comm), direction and class name of every entry
  name, vectorised in Arrow;
- :func:`stack_refs`: which stack of stack.json each node was called from;
- :func:`node_columns`: the columns of the node records (:data:`collectors.records.NODE`): every
  entry, then the construct.json nodes without one, with parents, depths, execution order and
  stack references.

>>> classify_entries(["Module.fc.Linear.forward.0", "Torch.matmul.2.backward"]).to_pylist()
... # doctest: +NORMALIZE_WHITESPACE
[{'kind': 'module', 'direction': 'forward', 'cls': 'Linear'},
 {'kind': 'api', 'direction': 'backward', 'cls': 'Torch.matmul'}]
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from collectors.msprobe_layout import MODULE_PREFIXES, parse_node_name

__all__ = ["classify_entries", "stack_refs", "node_columns"]


def classify_entries(names: list[str]) -> pa.Table:
    """kind, direction and class name of every entry name (vectorised over the names' dot
    separated parts; names of neither msprobe form are read by
    :func:`collectors.msprobe_layout.parse_node_name`).

    Module names are ``(Module|Cell).<path.Class>.(forward|backward|parameters_grad).<call>``,
    API names ``<Prefix>.<api>.<call>.(forward|backward)``.
    """
    import numpy as np
    import pyarrow.compute as pc

    arr = pa.array(names, type=pa.string())
    parts = pc.split_pattern(arr, ".")
    ends = parts.offsets.to_numpy(zero_copy_only=False)
    values = parts.values

    def from_end(k: int) -> pa.Array:
        return values.take(np.maximum(ends[1:] - k, ends[:-1]))
    first, last, second, third = values.take(ends[:-1]), from_end(1), from_end(2), from_end(3)
    length = pc.utf8_length
    body_len = pc.subtract(pc.subtract(pc.subtract(length(arr), length(first)),
                                       pc.add(length(second), length(last))), 3)
    shaped = pc.and_(pa.array(np.diff(ends) >= 4), pc.greater(body_len, 0))
    is_mod = pc.and_(shaped, pc.and_(pc.is_in(first, pa.array(list(MODULE_PREFIXES))),
                                     pc.and_(pc.is_in(second, pa.array(["forward", "backward", "parameters_grad"])),
                                             pc.match_substring_regex(last, "^[0-9]+$"))))
    is_api = pc.and_(pc.and_(shaped, pc.greater(length(first), 0)),
                     pc.and_(pc.match_substring_regex(second, "^[0-9]+$"),
                             pc.is_in(last, pa.array(["forward", "backward"]))))
    kind = pc.if_else(is_mod, "module", pc.if_else(pc.equal(first, "Distributed"), "comm", "api"))
    direction = pc.if_else(pc.equal(pc.if_else(is_mod, second, last), "forward"), "forward", "backward")
    cls = pc.if_else(is_mod, third, pa.nulls(len(arr), pa.string()))
    api_rows = pc.indices_nonzero(pc.and_(is_api, pc.invert(is_mod)))
    if len(api_rows):
        api_cls = pc.replace_substring_regex(arr.take(api_rows), r"\.[^.]*\.[^.]*$", "")
        mask = np.zeros(len(arr), dtype=bool)
        mask[api_rows.to_numpy()] = True
        cls = pc.replace_with_mask(cls, pa.array(mask), api_cls)
    table = pa.table({"kind": kind, "direction": direction, "cls": cls})
    odd = pc.indices_nonzero(pc.invert(pc.or_(is_mod, is_api))).to_pylist()
    if odd:
        cols = {k: table.column(k).to_pylist() for k in table.column_names}
        for i in odd:
            k, prefix, body, d, _ = parse_node_name(names[i])
            cols["kind"][i] = k
            cols["direction"][i] = "forward" if d == "forward" else "backward"
            cols["cls"][i] = body.rsplit(".", 1)[-1] if k == "module" else f"{prefix}.{body}"
        table = pa.table({k: pa.array(v, type=pa.string()) for k, v in cols.items()})
    return table


def stack_refs(stack: Any) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Node -> stack ref and ref -> stack lines: msprobe writes ``{"0": [[names], [lines]]}``,
    older dumps ``{name: lines}``.

    >>> stack_refs({"0": [["Module.fc.Linear.forward.0"], ["File x.py, line 3"]]})
    ({'Module.fc.Linear.forward.0': '0'}, {'0': ['File x.py, line 3']})
    """
    refs: dict[str, str] = {}
    lines: dict[str, list[str]] = {}
    if not isinstance(stack, dict):
        return refs, lines
    for key, val in stack.items():
        if isinstance(val, list) and len(val) == 2 and isinstance(val[0], list):
            for n in val[0]:
                if isinstance(n, str):
                    refs[n] = key
            val = val[1]
        else:
            refs[key] = key
        if isinstance(val, list):
            lines[key] = [str(x) for x in val]
    return refs, lines


def _depths(construct: dict) -> dict[str, int]:
    """Depth of every node of construct.json (roots 0), following parent links once each."""
    memo: dict[str, int] = {}
    for start, parent in construct.items():
        if start in memo:
            continue
        if parent is None:
            memo[start] = 0
            continue
        chain = [start]
        cur = parent
        while isinstance(cur, str) and cur not in memo and len(chain) < 10_000:
            chain.append(cur)
            cur = construct.get(cur)
        base = memo.get(cur, -1) if isinstance(cur, str) else -1
        for node in reversed(chain):
            base += 1
            memo[node] = base
    return memo


def node_columns(names: list[str], classes: pa.Array, construct: dict,
                 refs: dict[str, str]) -> dict[str, pa.Array]:
    """The node records' columns but ``run`` and ``rank``: every entry of ``names`` (its class
    in ``classes``), then the ``construct`` (construct.json) nodes without an entry; parents,
    depths, execution order and stack references (``refs``, from :func:`stack_refs`) looked
    up in Arrow (no loop per node).

    >>> cols = node_columns(["Module.fc.Linear.forward.0"], pa.array(["Linear"]),
    ...                     {"Module.fc.Linear.forward.0": "Module.net.Net.forward.0",
    ...                      "Module.net.Net.forward.0": None}, {})
    >>> cols["node"].to_pylist(), cols["depth"].to_pylist(), cols["order"].to_pylist()
    (['Module.fc.Linear.forward.0', 'Module.net.Net.forward.0'], [1, 0], [0, 1])
    """
    import numpy as np
    import pyarrow.compute as pc

    known = set(names)
    extra = [x for x in construct if x not in known]
    node = pa.array(names + extra, type=pa.string())
    cls = pa.concat_arrays([classes.cast(pa.string()),
                            classify_entries(extra).column("cls").combine_chunks()]) if extra else classes
    n = len(node)
    # construct.json, in its order (calls as they start): parent and depth of each node
    keys = pa.array(list(construct), type=pa.string())
    where = pc.index_in(node, value_set=keys)                 # position in construct, or null
    parents = [p if isinstance(p, str) else None for p in construct.values()]
    depth_of = _depths(construct)
    depths = pa.array([depth_of.get(x, 0) for x in construct], type=pa.int32())
    parent = pa.array(parents, type=pa.string()).take(where) if len(keys) else pa.nulls(n, pa.string())
    depth = pc.fill_null(depths.take(where), 0) if len(keys) else pa.array(np.zeros(n, np.int32))
    # execution order: construct.json's, then the entries it lacks in dump order
    order = pc.fill_null(where.cast(pa.int64()),
                         pa.array(np.arange(len(keys), len(keys) + n, dtype=np.int64)))
    if refs:
        ref_keys = pa.array(list(refs), type=pa.string())
        stack_ref = pa.array(list(refs.values()), type=pa.string()).take(
            pc.index_in(node, value_set=ref_keys))
    else:
        stack_ref = pa.nulls(n, pa.string())
    return {"node": node, "parent": parent, "class_name": cls, "depth": depth, "order": order,
            "stack_ref": stack_ref}
