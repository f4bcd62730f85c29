// The graph-diff page's client model: per side, the visible nodes (entries of visualizer/view.py)
// and their edges, changed only by the deltas the server sends in g-update ({a: delta, b: delta,
// mark}); the tree (tree.js) and the graph (graph.js) both draw from it. Clicks, double clicks and
// keys are handed back to Dash through the g-click store (one listener for all).
(function () {
  var P = window.probe = window.probe || {};

  function side(s) {
    P.sides = P.sides || {};
    if (!P.sides[s]) {
      P.sides[s] = {nodes: new Map(), kids: new Map(), edges: new Map(), flat: null, version: 0,
                    sel: null, path: new Set(), chain: new Set(), echain: new Set()};
    }
    return P.sides[s];
  }
  P.side = side;

  function kidsOf(m, id) {
    var key = id == null ? '' : id;
    var list = m.kids.get(key);
    if (!list) { list = []; m.kids.set(key, list); }
    return list;
  }
  P.kidsOf = kidsOf;

  function prune(m, id) {
    var stack = (m.kids.get(id) || []).slice();
    m.kids.set(id, []);
    while (stack.length) {
      var n = stack.pop();
      var below = m.kids.get(n);
      if (below) { Array.prototype.push.apply(stack, below); m.kids.delete(n); }
      m.nodes.delete(n);
    }
  }

  // delta: {reset, add: [entry], prune: [id], set: [partial entry], ea: [[s, t]], er: [[s, t]]}
  function applyDelta(s, d) {
    if (!d) { return; }
    var m = side(s), i;
    if (d.reset) {
      m.nodes.clear(); m.kids.clear(); m.edges.clear();
      m.sel = null; m.path.clear(); m.chain.clear(); m.echain.clear();
    }
    for (i = 0; i < d.prune.length; i++) { prune(m, d.prune[i]); }
    for (i = 0; i < d.add.length; i++) {
      var e = d.add[i];
      m.nodes.set(e.n, e);
      kidsOf(m, e.p).push(e.n);
    }
    for (i = 0; i < d.set.length; i++) {
      var held = m.nodes.get(d.set[i].n);
      if (held) { Object.assign(held, d.set[i]); }
    }
    for (i = 0; i < d.er.length; i++) { m.edges.delete(d.er[i][0] + '\u2192' + d.er[i][1]); }
    for (i = 0; i < d.ea.length; i++) { m.edges.set(d.ea[i][0] + '\u2192' + d.ea[i][1], d.ea[i]); }
    m.flat = null;
    m.version += 1;
    m.reset = m.reset || !!d.reset;
  }

  // The visible nodes depth first, in execution order (the tree's rows), cached per version.
  P.flat = function (s) {
    var m = side(s);
    if (!m.flat) {
      var out = [], stack = kidsOf(m, null).slice().reverse();
      while (stack.length) {
        var n = stack.pop();
        out.push(n);
        var e = m.nodes.get(n);
        if (e && e.o) {
          var k = m.kids.get(n);
          for (var j = k ? k.length - 1 : -1; j >= 0; j--) { stack.push(k[j]); }
        }
      }
      m.flat = out;
      m.index = new Map(out.map(function (n, i) { return [n, i]; }));
    }
    return m.flat;
  };

  P.depth = function (s, id) {
    var m = side(s), d = 0, e = m.nodes.get(id);
    while (e && e.p != null) { d += 1; e = m.nodes.get(e.p); }
    return d;
  };

  // Extra classes of a node from the selection and the highlighted chains.
  P.marks = function (s, id) {
    var m = side(s), out = '';
    if (m.sel === id) { out += ' sel'; }
    if (m.path.has(id)) { out += ' onpath'; }
    if (m.chain.has(id)) { out += ' chain'; }
    return out;
  };

  // mark: {sel: [side, node] | null, twin: node | null, path: {a: [], b: []}, chain: {a: [], b: []},
  //        echain: {a: [[s, t]], b: [...]}, focus: bool}
  function applyMark(mark) {
    ['a', 'b'].forEach(function (s) {
      var m = side(s);
      m.sel = mark.sel ? (mark.sel[0] === s ? mark.sel[1] : mark.twin) : null;
      m.path = new Set((mark.path || {})[s] || []);
      m.chain = new Set((mark.chain || {})[s] || []);
      m.echain = new Set(((mark.echain || {})[s] || []).map(function (e) { return e[0] + '\u2192' + e[1]; }));
    });
    if (mark.sel) { P.current = mark.sel[0]; }
  }

  // update: {a: delta, b: delta, mark: mark | null}; returns what it drew (for tests and timing)
  P.applyUpdate = function (u) {
    if (!u) { return ''; }
    applyDelta('a', u.a);
    applyDelta('b', u.b);
    if (u.mark) { applyMark(u.mark); }
    var focus = !!(u.mark && u.mark.focus);
    ['a', 'b'].forEach(function (s) {
      var m = side(s), reset = m.reset;
      m.reset = false;
      if (P.tree) { P.tree.render(s, focus); }
      if (P.graph) { P.graph.schedule(s, reset, focus); }
    });
    P.updates = (P.updates || 0) + 1;
    return String(P.updates);
  };

  P.send = function (act, s, node, extra) {
    if (!window.dash_clientside || !window.dash_clientside.set_props) { return; }
    window.dash_clientside.set_props('g-click', {
      data: Object.assign({act: act, side: s, node: node, t: Date.now()}, extra || {})
    });
  };

  document.addEventListener('click', function (e) {
    var el = e.target.closest('[data-act]');
    if (!el) { return; }
    P.send(el.dataset.act, el.dataset.side, el.dataset.node);
  });

  // Keys: up/down the next/previous visible node, right opens (or goes to the first child), left
  // closes (or goes to the parent), Enter opens or closes; on the side of the selection.
  document.addEventListener('keydown', function (e) {
    var t = e.target;
    if (!document.getElementById('page-graph') || e.altKey || e.ctrlKey || e.metaKey ||
        (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable))) { return; }
    var s = P.current || 'a', m = side(s);
    if (!m.nodes.size) { return; }
    var flat = P.flat(s), i = m.sel != null && m.index.has(m.sel) ? m.index.get(m.sel) : -1;
    var cur = i >= 0 ? m.nodes.get(flat[i]) : null;
    var go = null, act = 'select';
    if (e.key === 'ArrowDown') { go = flat[Math.min(flat.length - 1, i + 1)]; }
    else if (e.key === 'ArrowUp') { go = flat[Math.max(0, i - 1)]; }
    else if (e.key === 'ArrowRight' && cur) {
      if (cur.k && !cur.o) { go = cur.n; act = 'toggle'; } else if (cur.o) { go = (m.kids.get(cur.n) || [])[0]; }
    } else if (e.key === 'ArrowLeft' && cur) {
      if (cur.o) { go = cur.n; act = 'toggle'; } else if (cur.p != null) { go = cur.p; }
    } else if (e.key === 'Enter' && cur && cur.k) { go = cur.n; act = 'toggle'; }
    else { return; }
    e.preventDefault();
    if (go != null) { P.send(act, s, go); }
  });
})();
