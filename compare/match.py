"""Match the call groups of two sides: exact normalised names, then structure, then ancestors.

:func:`match_groups` takes the two normalised sides (:class:`probe.compare.normalise.Side`: call
groups and tensors, pyarrow.Tables, queried as ``a_g``/``b_g`` and ``a_t``/``b_t`` on the
connection it is given) and returns :class:`Matches`, pyarrow.Tables: the group ``pairs``
(grp_a, grp_b, method, reason), each side's group ``state``, and the groups compared at an
ancestor (``covered``) or found to be an extra level (``containers``). The pairs are found in
these steps:

1. ``exact``: the same framework-free name (module path + call; API name + call within the
   parent module, or within the whole dump when one side has no construct.json parents),
   unique on both sides (one SQL join); an API pair whose output shapes differ is left to
   the structural step (its call numbers are off: one side made an extra call);
2. ``mapping``: pairs given by an msprobe mapping file (:mod:`probe.compare.mapping`), applied first;
3. ``structure``: with no mapping file, the unmatched groups between two consecutive matched
   anchors are aligned in execution order by dynamic programming over a score built from
   class, tensor shapes (inputs, outputs, parameters), depth, leaf name and the closeness of
   the input, output and parameter norms (one fault perturbs some of them, never all);
   a pair must agree on output shapes and on inputs, parameters or class, and must sit under
   matched ancestors (tree consistency);
4. ``ancestor``: a group with no counterpart (fused/unfused structure) is attached to its
   nearest matched ancestor, which is where the two implementations are compared;
5. ``container``: a group with no counterpart and no matched ancestor whose children are
   matched is an extra level of one side (a ``decoder`` wrapper around the layers).

>>> score_pair({"kind": "module", "cls": "linear", "in": "[4, 8]", "out": "[4, 2]",
...             "par": "[2, 8]", "leaf": "q", "depth": 2, "onorm": 1.0},
...            {"kind": "module", "cls": "linear", "in": "[4, 8]", "out": "[4, 2]",
...             "par": "[2, 8]", "leaf": "q", "depth": 2, "onorm": 1.0}) > 0
True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from probe.compare.normalise import Side
from probe.compare.tables import registered

__all__ = ["Matches", "match_groups", "score_pair", "align"]


@dataclass
class Matches:
    """What :func:`match_groups` found, as pyarrow.Tables:

    - ``pairs``: (grp_a, grp_b, method, reason), one row per matched group pair, in the order
      they were found (a pair's row number is its id in the tensor rows);
    - ``state_a``, ``state_b``: (grp, state), every group of the side: ``matched``,
      ``ancestor`` (compared at its nearest matched ancestor), ``container`` or ``unmatched``;
    - ``covered``: (side, grp, anc_a, anc_b), each ``ancestor`` group and the pair it is
      compared at;
    - ``containers``: (side, grp), each ``container`` group (an extra level of one side).
    """

    pairs: pa.Table
    state_a: pa.Table
    state_b: pa.Table
    covered: pa.Table
    containers: pa.Table

_DP_CELLS = 4_000_000


def _tokens(name: str) -> set[str]:
    out = set()
    for part in name.replace("-", "_").split("_"):
        if part:
            out.add(part)
    return out


def score_pair(a: dict, b: dict) -> float:
    """Similarity of two call groups; ``0`` when they may not be paired structurally."""
    if a["kind"] != b["kind"]:
        return 0.0
    if a["out"] != b["out"] or not a["out"]:
        return 0.0
    same_in = a["in"] == b["in"] and bool(a["in"])
    same_par = a["par"] == b["par"]
    same_cls = a["cls"] == b["cls"]
    if a["kind"] != "module" and not same_cls:
        return 0.0  # API calls pair only with the same operation; the rest is compared at the module
    if not (same_in or (same_par and a["par"]) or same_cls):
        return 0.0
    if a["par"] and b["par"] and not same_par:
        return 0.0
    s = 3.0 + 3.0 * same_in + 2.0 * (same_par and bool(a["par"])) + 2.0 * same_cls
    if not same_cls and (a["cls"] in b["cls"] or b["cls"] in a["cls"]):
        s += 1.0
    if a["leaf"] == b["leaf"]:
        s += 2.0
    elif _tokens(a["leaf"]) & _tokens(b["leaf"]) or a["leaf"].startswith(b["leaf"]) \
            or b["leaf"].startswith(a["leaf"]):
        s += 1.0
    if a["depth"] == b["depth"]:
        s += 0.5
    for key in ("inorm", "onorm", "pnorm"):
        s += _closeness(a.get(key), b.get(key))
    return s


def _closeness(x: float | None, y: float | None) -> float:
    """2 when two statistics agree to 1e-3, 1 to 1e-1, else 0 (NaN/None: 0)."""
    if x is None or y is None or x != x or y != y:
        return 0.0
    rel = abs(x - y) / max(abs(x), abs(y), 1e-30)
    return 2.0 if rel < 1e-3 else 1.0 if rel < 1e-1 else 0.0


def align(seq_a: list[dict], seq_b: list[dict]) -> list[tuple[int, int, float]]:
    """Order-preserving alignment maximising the summed :func:`score_pair` (Needleman-Wunsch)."""
    n, m = len(seq_a), len(seq_b)
    if not n or not m:
        return []
    if n * m > _DP_CELLS:
        return _align_greedy(seq_a, seq_b)
    prev = [0.0] * (m + 1)
    back: list[bytearray] = []
    for i in range(1, n + 1):
        cur = [0.0] * (m + 1)
        bt = bytearray(m + 1)
        a = seq_a[i - 1]
        for j in range(1, m + 1):
            best, how = prev[j], 1
            if cur[j - 1] > best:
                best, how = cur[j - 1], 2
            s = score_pair(a, seq_b[j - 1])
            if s > 0 and prev[j - 1] + s > best:
                best, how = prev[j - 1] + s, 3
            cur[j] = best
            bt[j] = how
        back.append(bt)
        prev = cur
    out = []
    i, j = n, m
    while i > 0 and j > 0:
        how = back[i - 1][j]
        if how == 3:
            out.append((i - 1, j - 1, score_pair(seq_a[i - 1], seq_b[j - 1])))
            i, j = i - 1, j - 1
        elif how == 1:
            i -= 1
        else:
            j -= 1
    out.reverse()
    return out


def _align_greedy(seq_a: list[dict], seq_b: list[dict]) -> list[tuple[int, int, float]]:
    """Linear-time fallback for huge gaps: walk both sequences, pairing the next compatible one."""
    out, j = [], 0
    for i, a in enumerate(seq_a):
        for k in range(j, min(j + 16, len(seq_b))):
            s = score_pair(a, seq_b[k])
            if s > 0:
                out.append((i, k, s))
                j = k + 1
                break
    return out


_FEATURES = """
with t as (
  select grp, slot, idx, cast(shape as varchar) as sh, norm,
         row_number() over (partition by grp, slot order by seq, idx) as k
  from {s}_t where direction = 'forward'
)
select g.grp, g.kind, g.cls_norm as cls, g.canon, g.leaf, g.depth, g.parent, g.ord_f,
  coalesce((select string_agg(sh, ';' order by k) from t where t.grp = g.grp and t.slot in ('input', 'kwarg')), '') as "in",
  coalesce((select string_agg(sh, ';' order by k) from t where t.grp = g.grp and t.slot = 'output'), '') as "out",
  coalesce((select string_agg(sh, ';' order by sh) from t where t.grp = g.grp and t.slot = 'parameter'), '') as par,
  (select norm from t where t.grp = g.grp and t.slot = 'output' and k = 1) as onorm,
  (select norm from t where t.grp = g.grp and t.slot in ('input', 'kwarg') order by k limit 1) as inorm,
  (select max(norm) from t where t.grp = g.grp and t.slot = 'parameter') as pnorm
from {s}_g g
where g.fwd is not null and g.grp not in (select grp_{s} from pairs where grp_{s} is not null)
order by g.ord_f
"""


def _features(con: Any, side: str) -> list[dict]:
    cur = con.execute(_FEATURES.format(s=side))
    cols = [d[0] for d in cur.description]
    out = []
    for row in cur.fetchall():
        d = dict(zip(cols, row))
        if d["kind"] != "module":
            d["cls"] = d["canon"]
        d["leaf"] = d["leaf"] or ""
        out.append(d)
    return out


def match_groups(con: Any, a: Side, b: Side, mapped: pa.Table | None = None,
                 structural: bool = True) -> Matches:
    """The matched groups of sides ``a`` and ``b`` (see the module docstring), found by DuckDB
    on ``con`` (its tables temporary, dropped before it returns). ``mapped``: the pairs a
    mapping file gives (:func:`probe.compare.mapping.mapped_pairs`), taken first;
    ``structural``: whether to align the groups left unmatched by name by structure."""
    with registered(con, a_g=a.groups, b_g=b.groups, a_t=a.tensors, b_t=b.tensors):
        _match(con, mapped, structural)
        found = Matches(con.sql("select * from pairs order by rowid").to_arrow_table(),
                        *(con.sql(f"select * from {t}").to_arrow_table()
                          for t in ("a_st", "b_st", "covered", "containers")))
    for t in ("pairs", "a_st", "b_st", "covered", "containers", "anc_a", "anc_b"):
        con.execute(f"drop table if exists {t}")
    return found


def _match(con: Any, mapped: pa.Table | None, structural: bool) -> None:
    """Fill the temporary tables of :class:`Matches` in ``con`` from ``a_g``/``b_g`` and
    ``a_t``/``b_t``."""
    con.execute("create or replace temp table pairs (grp_a bigint, grp_b bigint, method varchar, reason varchar)")
    if mapped is not None and mapped.num_rows:
        with registered(con, mapped_pairs=mapped):
            con.execute("""insert into pairs select grp_a, grp_b, 'mapping', reason from mapped_pairs""")
    scoped = con.execute("""
        select (select count(*) filter (where parent is not null) > 0 or count(*) = 0 from a_g where kind <> 'module'),
               (select count(*) filter (where parent is not null) > 0 or count(*) = 0 from b_g where kind <> 'module')
    """).fetchall()[0]
    key = "exact_key" if all(scoped) else "global_key"
    con.execute(f"""
    insert into pairs
    with ua as (select {key} as k, any_value(grp) as grp, count(*) as n from a_g g
                anti join pairs p on p.grp_a = g.grp group by all),
         ub as (select {key} as k, any_value(grp) as grp, count(*) as n from b_g g
                anti join pairs p on p.grp_b = g.grp group by all),
         -- output shapes decide only API and communication matches: modules need no signature
         sig as (select 'a' as side, grp, string_agg(cast(shape as varchar), ';' order by idx) as out_sig
                 from a_t where direction = 'forward' and slot = 'output'
                   and grp in (select grp from a_g where kind <> 'module') group by grp
                 union all
                 select 'b', grp, string_agg(cast(shape as varchar), ';' order by idx)
                 from b_t where direction = 'forward' and slot = 'output'
                   and grp in (select grp from b_g where kind <> 'module') group by grp)
    select ua.grp, ub.grp, 'exact', 'same normalised name'
    from ua join ub using (k)
    left join sig sa on sa.side = 'a' and sa.grp = ua.grp
    left join sig sb on sb.side = 'b' and sb.grp = ub.grp
    where ua.n = 1 and ub.n = 1
      and (sa.out_sig is null or sb.out_sig is null or sa.out_sig = sb.out_sig
           or not starts_with(k, 'api') and not starts_with(k, 'comm'))
    """)
    unmatched = con.execute("""
        select (select count(*) from a_g g anti join pairs p on p.grp_a = g.grp),
               (select count(*) from b_g g anti join pairs p on p.grp_b = g.grp)""").fetchall()[0]
    if structural and all(unmatched):
        _structural(con, ("module",))
        _structural(con, ("api", "comm"))
    if any(unmatched):
        _ancestors(con)
    else:
        con.execute("create or replace temp table covered (side varchar, grp bigint, anc_a bigint, anc_b bigint)")
        con.execute("create or replace temp table containers (side varchar, grp bigint)")
    for side in ("a", "b"):
        con.execute(f"""
        create or replace temp table {side}_st as
        select g.grp, case when p.grp_{side} is not null then 'matched'
                           when c.grp is not null then 'ancestor'
                           when k.grp is not null then 'container' else 'unmatched' end as state
        from {side}_g g
        left join (select distinct grp_{side} from pairs) p on p.grp_{side} = g.grp
        left join (select distinct grp from covered where side = '{side}') c on c.grp = g.grp
        left join (select distinct grp from containers where side = '{side}') k on k.grp = g.grp
        """)


def _structural(con: Any, kinds: tuple[str, ...]) -> None:
    """Align the unmatched groups of ``kinds`` between anchors of the same kinds (modules
    first, on module anchors only, so API calls never pull the module trees out of line)."""
    fa = [f for f in _features(con, "a") if f["kind"] in kinds]
    fb = [f for f in _features(con, "b") if f["kind"] in kinds]
    if not fa or not fb:
        return
    anchors = con.execute(f"""
        select ga.ord_f, gb.ord_f from pairs p join a_g ga on ga.grp = p.grp_a
        join b_g gb on gb.grp = p.grp_b where ga.ord_f is not null and gb.ord_f is not null
          and ({"ga.kind = 'module'" if kinds == ("module",) else "true"})
        order by ga.ord_f""").fetchall()

    chain = _increasing(anchors)
    bounds = [(-1, -1)] + chain + [(1 << 62, 1 << 62)]
    ia = ib = 0
    found: list[tuple[dict, dict, float]] = []
    for (lo_a, lo_b), (hi_a, hi_b) in zip(bounds, bounds[1:]):
        seg_a, seg_b = [], []
        while ia < len(fa) and fa[ia]["ord_f"] < hi_a:
            if fa[ia]["ord_f"] > lo_a:
                seg_a.append(fa[ia])
            ia += 1
        while ib < len(fb) and fb[ib]["ord_f"] < hi_b:
            if fb[ib]["ord_f"] > lo_b:
                seg_b.append(fb[ib])
            ib += 1
        for i, j, s in align(seg_a, seg_b):
            found.append((seg_a[i], seg_b[j], s))
    if not found:
        return
    matched_a = dict(con.execute("select grp_a, grp_b from pairs").fetchall())
    parent_a = dict(con.execute("select grp, parent from a_g").fetchall())
    parent_b = dict(con.execute("select grp, parent from b_g").fetchall())
    keep = []
    for a, b, s in sorted(found, key=lambda x: x[0]["depth"]):
        anc_a = _nearest(a["grp"], parent_a, matched_a)
        anc_b = _nearest(b["grp"], parent_b, set(matched_a.values()))
        if (anc_a is None and anc_b is None) or (anc_a is not None and matched_a.get(anc_a) == anc_b):
            matched_a[a["grp"]] = b["grp"]
            keep.append((a["grp"], b["grp"], "structure",
                         f"aligned by structure (score {s:.1f}: position, class, shapes)"))
    if keep:
        with registered(con, struct_pairs=pa.table({k: [r[i] for r in keep] for i, k in
                                                    enumerate(["grp_a", "grp_b", "method", "reason"])})):
            con.execute("insert into pairs select * from struct_pairs")


def _nearest(grp: int, parent: dict, matched: Any) -> int | None:
    cur = parent.get(grp)
    hops = 0
    while cur is not None and hops < 10_000:
        if cur in matched:
            return cur
        cur = parent.get(cur)
        hops += 1
    return None


def _increasing(pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Longest chain of anchors increasing on both sides (drops crossing matches)."""
    import bisect

    tails: list[int] = []
    idx: list[int] = []
    prev = [-1] * len(pairs)
    for k, (_, b) in enumerate(pairs):
        pos = bisect.bisect_left(tails, b)
        if pos == len(tails):
            tails.append(b)
            idx.append(k)
        else:
            tails[pos] = b
            idx[pos] = k
        prev[k] = idx[pos - 1] if pos else -1
    out = []
    k = idx[-1] if idx else -1
    while k >= 0:
        out.append(pairs[k])
        k = prev[k]
    return out[::-1]


def _ancestors(con: Any) -> None:
    """Attach every unmatched group to the nearest matched ancestor pair (fused/unfused)."""
    for side, other in (("a", "b"), ("b", "a")):
        con.execute(f"""
        create or replace temp table anc_{side} as
        with recursive up(grp, cur, hops) as (
            select g.grp, g.parent, 0 from {side}_g g
            where g.grp not in (select grp_{side} from pairs where grp_{side} is not null)
              and g.parent is not null
            union all
            select up.grp, g.parent, up.hops + 1 from up join {side}_g g on g.grp = up.cur
            where up.cur not in (select grp_{side} from pairs where grp_{side} is not null)
              and up.hops < 200
        )
        select up.grp, arg_min(up.cur, up.hops) as anc from up
        where up.cur in (select grp_{side} from pairs where grp_{side} is not null)
        group by up.grp
        """)
    con.execute("""
    create or replace temp table containers as
    with st as (
      select 'a' as side, g.grp, g.parent, p.grp_a is not null as m from a_g g
        left join (select distinct grp_a from pairs) p on p.grp_a = g.grp
      union all
      select 'b', g.grp, g.parent, p.grp_b is not null from b_g g
        left join (select distinct grp_b from pairs) p on p.grp_b = g.grp
    ), cov as (select 'a' as side, grp from anc_a union all select 'b', grp from anc_b)
    select distinct s.side, s.grp from st s
    join st ch on ch.side = s.side and ch.parent = s.grp and ch.m
    anti join cov on cov.side = s.side and cov.grp = s.grp
    where not s.m
    """)
    con.execute("""
    create or replace temp table covered as
    select 'a' as side, x.grp, x.anc as anc_a, p.grp_b as anc_b from anc_a x
      join pairs p on p.grp_a = x.anc
    union all
    select 'b', x.grp, p.grp_a, x.anc from anc_b x join pairs p on p.grp_b = x.anc
    """)
