"""The nodes of an msprobe dump: each entry's kind, direction and class, and the module tree.

- :func:`classify_entries`: kind (module|api|comm), direction and class name of every entry
  name, vectorised in Arrow;
- :func:`stack_refs`: which stack of stack.json each node was called from;
- :func:`repair_tree`: construct.json's parents with a broken tree mended (a parent cycle, or
  a parent that is no node of the dump, as older dumps have in their backward nodes), so that
  every node is reachable from a root;
- :func:`node_columns`: the columns of the node records (:data:`probe.collectors.records.NODE`): every
  entry, then the construct.json nodes without one, with parents (mended, with one warning
  naming the file), depths, execution order and stack references.

>>> classify_entries(["Module.fc.Linear.forward.0", "Torch.matmul.2.backward"]).to_pylist()
... # doctest: +NORMALIZE_WHITESPACE
[{'kind': 'module', 'direction': 'forward', 'cls': 'Linear'},
 {'kind': 'api', 'direction': 'backward', 'cls': 'Torch.matmul'}]
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import pyarrow as pa

from probe.collectors.msprobe_layout import parse_node_name
from probe.ground.frameworks import module_prefixes

log = logging.getLogger(__name__)

__all__ = ["classify_entries", "stack_refs", "repair_tree", "node_columns"]


def classify_entries(names: list[str]) -> pa.Table:
    """kind, direction and class name of every entry name (vectorised over the names' dot
    separated parts; names of neither msprobe form are read by
    :func:`probe.collectors.msprobe_layout.parse_node_name`).

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
    is_mod = pc.and_(shaped, pc.and_(pc.is_in(first, pa.array(list(module_prefixes()))),
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


def _twin(name: str, direction: str) -> str | None:
    """The same call's entry in the other direction (``direction``: the wanted one), by name:
    ``Module.x.Linear.backward.0`` <-> ``...forward.0``, ``Functional.linear.3.backward`` <->
    ``...forward``; ``None`` when the name has no direction to swap."""
    have = "backward" if direction == "forward" else "forward"
    if name.endswith(f".{have}"):
        return name[: -len(have)] + direction
    head, sep, tail = name.rpartition(f".{have}.")
    return f"{head}.{direction}.{tail}" if sep else None


def _reach(parent: dict[str, str | None], nodes: set[str]) -> tuple[dict[str, bool], set[str]]:
    """Whether each node of ``parent`` reaches a root through nodes of the dump, and the nodes
    that are themselves the break (on a cycle, or with a parent that is no node)."""
    ok: dict[str, bool] = {}
    culprits: set[str] = set()
    for start in parent:
        chain: list[str] = []
        seen: set[str] = set()
        cur: str | None = start
        while True:
            if cur is None:
                good = True
                break
            if cur in ok:
                good = ok[cur]
                break
            if cur in seen:                                  # a cycle: every member is a break
                culprits.update(chain[chain.index(cur):])
                good = False
                break
            chain.append(cur)
            seen.add(cur)
            nxt = parent.get(cur)
            if nxt is not None and nxt not in nodes:        # a parent that is no node
                culprits.add(cur)
                good = False
                break
            cur = nxt
        for n in chain:
            ok[n] = good
    return ok, culprits


def repair_tree(construct: dict, names: Iterable[str] = ()) -> tuple[dict[str, str | None], int]:
    """construct.json's ``node -> parent`` with a broken tree mended, and how many nodes were
    re-parented. ``names``: the dump's entries (nodes too, when construct.json lacks them).

    A node is broken when following its parents never reaches a root: a parent cycle, or a
    parent that is no node of the dump. A broken backward node goes under the backward entry
    of its forward node's parent (the nearest such ancestor that has one; at the top when
    none); another broken node keeps its parent unless it is itself the break (on the cycle,
    or with the missing parent), which goes to the top. A tree that is whole is returned as it
    is.

    >>> fwd = {"M.net.Net.forward.0": None, "M.fc.Linear.forward.0": "M.net.Net.forward.0"}
    >>> cycle = {"M.net.Net.backward.0": "M.fc.Linear.backward.0",
    ...          "M.fc.Linear.backward.0": "M.net.Net.backward.0"}
    >>> parents, fixed = repair_tree({**fwd, **cycle})
    >>> parents["M.fc.Linear.backward.0"], parents["M.net.Net.backward.0"], fixed
    ('M.net.Net.backward.0', None, 1)
    """
    parent = {k: (v if isinstance(v, str) else None) for k, v in construct.items()}
    nodes = set(parent)
    nodes.update(names)
    ok, culprits = _reach(parent, nodes)
    broken = [n for n, good in ok.items() if not good]
    if not broken:
        return parent, 0
    fixed = dict(parent)
    for n in broken:
        fwd = _twin(n, "forward")
        if fwd is not None and ok.get(fwd, fwd in nodes):
            up = parent.get(fwd)
            while up is not None and _twin(up, "backward") not in nodes:
                up = parent.get(up)
            fixed[n] = _twin(up, "backward") if up is not None else None
        elif n in culprits:
            fixed[n] = None
    still, _ = _reach(fixed, nodes)                       # cycles through kept links: at the top
    for n, good in still.items():
        if not good:
            fixed[n] = None
    return fixed, sum(1 for n in broken if fixed[n] != parent[n])


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


def _whole_tree_depths(keys: pa.Array, parents: pa.Array, entries: pa.Array) -> pa.Array | None:
    """Each construct.json node's depth (as :func:`_depths` counts it) when the tree is whole
    (:func:`repair_tree` would return it as it is), else None; in NumPy by pointer doubling:
    every node jumps to its ancestor twice as far each round, ``log2(depth)`` rounds in all
    (100k nodes: 0.02 s, where following the parents in Python took 0.25 s).

    A parent that is no construct.json node but an entry of the dump ends a chain, one level
    above it (the depth :func:`_depths` gives); a parent that is neither, or a chain that
    never ends (a cycle), is a broken tree; and so is a chain of 10,000 nodes or more, where
    :func:`_depths` stops counting."""
    import numpy as np
    import pyarrow.compute as pc

    n = len(keys)
    if n == 0:
        return pa.array([], type=pa.int32())
    up = pc.index_in(parents, value_set=keys)
    outside = pc.and_(parents.is_valid(), up.is_null())       # a parent not in construct.json
    if pc.any(outside).as_py():
        if not pc.all(pc.is_in(pc.filter(parents, outside), value_set=entries)).as_py():
            return None                                      # a parent that is no node at all
    here = np.arange(n, dtype=np.int64)
    jump = pc.fill_null(up, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    top = jump < 0                                           # chains end at these nodes
    hops = np.where(top, 0, 1).astype(np.int64)
    jump = np.where(top, here, jump)
    for _ in range(max(1, int(n).bit_length()) + 1):
        nxt = jump[jump]
        if np.array_equal(nxt, jump):
            break
        hops += hops[jump]
        jump = nxt
    if not top[jump].all():                                  # a cycle somewhere above
        return None
    depth = hops + outside.to_numpy(zero_copy_only=False)[jump]
    if int(hops.max()) >= 9_999:
        return None
    return pa.array(depth.astype(np.int32))


def node_columns(names: list[str], classes: pa.Array, construct: dict,
                 refs: dict[str, str], source: Any = None) -> dict[str, pa.Array]:
    """The node records' columns but ``run`` and ``rank``: every entry of ``names`` (its class
    in ``classes``), then the ``construct`` (construct.json) nodes without an entry; parents
    (a broken tree mended by :func:`repair_tree`, said in one line on stderr naming
    ``source``, the construct.json), depths, execution order and stack references (``refs``,
    from :func:`stack_refs`) looked up in Arrow (no loop per node).

    >>> cols = node_columns(["Module.fc.Linear.forward.0"], pa.array(["Linear"]),
    ...                     {"Module.fc.Linear.forward.0": "Module.net.Net.forward.0",
    ...                      "Module.net.Net.forward.0": None}, {})
    >>> cols["node"].to_pylist(), cols["depth"].to_pylist(), cols["order"].to_pylist()
    (['Module.fc.Linear.forward.0', 'Module.net.Net.forward.0'], [1, 0], [0, 1])
    """
    import numpy as np
    import pyarrow.compute as pc

    keys = pa.array(list(construct), type=pa.string())
    parents = [p if isinstance(p, str) else None for p in construct.values()]
    entries = pa.array(names, type=pa.string())
    depths = _whole_tree_depths(keys, pa.array(parents, type=pa.string()), entries)
    extra = pc.filter(keys, pc.invert(pc.is_in(keys, value_set=entries))).to_pylist()
    fixed = 0
    if depths is None:                           # a broken tree (or one very deep): mended here
        construct, fixed = repair_tree(construct, set(names))
        parents = [p if isinstance(p, str) else None for p in construct.values()]
        depth_of = _depths(construct)
        depths = pa.array([depth_of.get(x, 0) for x in construct], type=pa.int32())
    if fixed:
        log.warning(f"{source or 'construct.json'}: {fixed} of {len(construct)} nodes re-parented "
                    "(their parents made a cycle or named no node of the dump; backward nodes now "
                    "sit under the backward entry of their forward node's parent)")
    node = pa.array(names + extra, type=pa.string())
    cls = pa.concat_arrays([classes.cast(pa.string()),
                            classify_entries(extra).column("cls").combine_chunks()]) if extra else classes
    n = len(node)
    # construct.json, in its order (calls as they start): parent and depth of each node
    where = pc.index_in(node, value_set=keys)                 # position in construct, or null
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
