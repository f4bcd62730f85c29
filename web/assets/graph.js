// The graph view of each side: the client model (view_model.js) drawn in the dash-cytoscape
// component g-graph-<side>. Boxes come laid out by the server (visualizer/layout.py, positions
// relative to the parent box); only the boxes in and near the viewport are handed to cytoscape,
// and when too many are, the deepest open boxes are drawn folded, so 10k visible nodes draw as
// fast as 100. Panning or zooming one side moves the other to the counterpart of the node in
// view; a tap selects, a double tap opens or closes, a tap on an edge follows it to the consumer,
// a drag anywhere (boxes too) pans.
// A minimap shows the whole side and the viewport; a click on it moves there.
(function () {
  var P = window.probe = window.probe || {};
  var MAX_DRAW = 1200, MARGIN = 0.5;
  var quiet = {}, pending = {}, fresh = {}, aim = {};

  function other(s) { return s === 'a' ? 'b' : 'a'; }

  // dash-cytoscape's container div holds cytoscape's instance (cytoscape registers it there)
  function cyOf(s) {
    var el = document.getElementById('g-graph-' + s);
    return el && el._cyreg ? el._cyreg.cy : null;
  }

  function absolute(s) {
    var m = P.side(s);
    if (m.absVersion === m.version) { return m.abs; }
    var abs = new Map(), w = 0, h = 0;
    var stack = P.kidsOf(m, null).map(function (n) { return [n, 0, 0, 0]; });
    while (stack.length) {
      var it = stack.pop(), e = m.nodes.get(it[0]);
      if (!e) { continue; }
      var x = it[1] + e.x, y = it[2] + e.y;
      abs.set(e.n, {x: x, y: y, d: it[3]});
      if (it[3] === 0) { w = Math.max(w, x + e.w); h = Math.max(h, y + e.hh); }
      if (e.o) {
        var k = m.kids.get(e.n) || [];
        for (var j = 0; j < k.length; j++) { stack.push([k[j], x, y, it[3] + 1]); }
      }
    }
    m.abs = abs; m.absVersion = m.version; m.bounds = {w: w, h: h};
    return abs;
  }

  // The nodes to draw: those meeting the viewport (and a margin), level by level from the top,
  // until MAX_DRAW; the open boxes whose children would pass it are drawn folded.
  function wanted(s, cy) {
    var m = P.side(s), abs = absolute(s), ext = cy.extent();
    var mx = (ext.x2 - ext.x1) * MARGIN, my = (ext.y2 - ext.y1) * MARGIN;
    var x1 = ext.x1 - mx, x2 = ext.x2 + mx, y1 = ext.y1 - my, y2 = ext.y2 + my;
    var level = P.kidsOf(m, null), ids = [], folded = new Set();
    while (level.length) {
      var hits = level.filter(function (n) {
        var a = abs.get(n), e = m.nodes.get(n);
        return a && a.x < x2 && a.x + e.w > x1 && a.y < y2 && a.y + e.hh > y1;
      });
      if (ids.length && ids.length + hits.length > MAX_DRAW) {
        hits.forEach(function (n) { folded.add(m.nodes.get(n).p); });
        break;
      }
      Array.prototype.push.apply(ids, hits);
      var next = [];
      hits.forEach(function (n) {
        if (m.nodes.get(n).o) { Array.prototype.push.apply(next, m.kids.get(n) || []); }
      });
      level = next;
    }
    return {ids: ids, folded: folded, abs: abs};
  }

  function label(e, folded) {
    var text = (/\borigin\b/.test(e.c) ? '◆ ' : '') + e.l;
    if (/\bnan\b/.test(e.c)) { text += '  ⚠NaN'; }
    if (e.h) { text += '  ● ' + e.h + ' inside'; }
    if (folded) { text += '  (…)'; }
    return text;
  }

  function sync(s) {
    var cy = cyOf(s);
    if (!cy) { return false; }
    setup(s, cy);
    var m = P.side(s), w = wanted(s, cy), want = new Set(w.ids);
    cy.batch(function () {
      cy.nodes().forEach(function (el) { if (!want.has(el.id())) { el.remove(); } });
      var add = [];
      w.ids.forEach(function (n) {
        var e = m.nodes.get(n), a = w.abs.get(n), fold = w.folded.has(n);
        var data = {id: n, label: label(e, fold), w: e.w, h: e.hh, z: (e.o && !fold ? 0 : 100) + a.d};
        var pos = {x: a.x + e.w / 2, y: a.y + e.hh / 2};
        var cls = e.c + P.marks(s, n) + (e.o && !fold ? ' box' : '') + (fold ? ' folded' : '') +
                  (e.h ? ' hint-' + e.h : '');
        var el = cy.getElementById(n);
        if (!el.length) {
          data.cls = cls;
          add.push({group: 'nodes', data: data, position: pos, classes: cls, pannable: true});
          return;
        }
        var p = el.position();
        if (p.x !== pos.x || p.y !== pos.y) { el.position(pos); }
        var d = el.data();
        if (d.label !== data.label || d.w !== data.w || d.h !== data.h || d.z !== data.z) { el.data(data); }
        if (d.cls !== cls) { el.data('cls', cls); el.classes(cls); }
      });
      if (add.length) { cy.add(add); }
      var edges = [];
      m.edges.forEach(function (ed, key) {
        if (!want.has(ed[0]) || !want.has(ed[1])) { return; }
        var id = 'e|' + key, cls = (m.echain.has(key) ? 'chain' : '') + (P.followed === id ? ' followed' : '');
        var el = cy.getElementById(id);
        if (!el.length) {
          edges.push({group: 'edges', data: {id: id, source: ed[0], target: ed[1], cls: cls}, classes: cls});
        } else if (el.data('cls') !== cls) { el.data('cls', cls); el.classes(cls); }
      });
      cy.edges().forEach(function (el) {
        var key = el.id().slice(2);
        if (!m.edges.has(key)) { el.remove(); }
      });
      if (edges.length) { cy.add(edges); }
    });
    var box = document.getElementById('g-graph-' + s);
    box.dataset.version = m.version;
    box.dataset.drawn = w.ids.length;
    minimap(s, cy);
    return true;
  }

  function move(s, fn) {
    var cy = cyOf(s);
    if (!cy) { return; }
    quiet[s] = true;
    try { fn(cy); } finally { quiet[s] = false; }
    schedule(s);
  }

  // Show the top of a side's graph, centred across.
  function home(s) {
    var cy = cyOf(s), b = P.side(s).bounds || {w: 0, h: 0}, z = 0.9;
    quiet[s] = true;
    try {
      cy.zoom(z);
      cy.pan({x: Math.max(20, cy.width() / 2 - b.w * z / 2), y: 20});
    } finally { quiet[s] = false; }
  }

  // Bring a node's box into view (whole when it fits, else its header line), zoomed in enough
  // to read and out enough to fit.
  function centre(s, id) {
    var m = P.side(s), e = m.nodes.get(id), a = absolute(s).get(id), cy = cyOf(s);
    if (!e || !a || !cy) { return; }
    var ext = cy.extent();
    if (a.x >= ext.x1 && a.x + e.w <= ext.x2 && a.y >= ext.y1 && a.y + e.hh <= ext.y2) { return; }
    var W = cy.width(), H = cy.height();
    var z = Math.max(0.25, Math.min(Math.max(cy.zoom(), 0.6), 0.9 * W / e.w, 0.9 * H / e.hh));
    quiet[s] = true;
    try {
      cy.zoom(z);
      var top = e.hh * z < H ? H / 2 - (a.y + e.hh / 2) * z : 20 - a.y * z;
      cy.pan({x: W / 2 - (a.x + e.w / 2) * z, y: top});
    } finally { quiet[s] = false; }
  }

  // Move side o so that the counterpart of the node in the middle of side s sits where that
  // node sits (same zoom).
  function follow(s) {
    var o = other(s), ca = cyOf(s), cb = cyOf(o), m = P.side(s), mo = P.side(o);
    if (!ca || !cb || !mo.nodes.size) { return; }
    var ext = ca.extent(), cx = (ext.x1 + ext.x2) / 2, cyy = (ext.y1 + ext.y2) / 2, abs = absolute(s);
    var best = null, bestD = Infinity;
    ca.nodes().forEach(function (el) {
      var e = m.nodes.get(el.id()), a = abs.get(el.id());
      if (!e || !a || (e.o && cx > a.x && cx < a.x + e.w && cyy > a.y && cyy < a.y + e.hh)) { return; }
      var dx = Math.max(a.x - cx, 0, cx - a.x - e.w), dy = Math.max(a.y - cyy, 0, cyy - a.y - e.hh);
      var dist = dx * dx + dy * dy;
      if (dist < bestD) { bestD = dist; best = e; }
    });
    while (best && !(best.t && mo.nodes.has(best.t))) { best = m.nodes.get(best.p); }
    if (!best) { return; }
    var a = abs.get(best.n), t = mo.nodes.get(best.t), at = absolute(o).get(best.t), z = ca.zoom();
    var rx = (a.x + best.w / 2) * z + ca.pan().x, ry = (a.y + best.hh / 2) * z + ca.pan().y;
    move(o, function (c) {
      c.zoom(z);
      c.pan({x: rx - (at.x + t.w / 2) * z, y: ry - (at.y + t.hh / 2) * z});
    });
  }

  function setup(s, cy) {
    if (cy._probe) { return; }
    cy._probe = true;
    // dash-cytoscape copies every element back into its `elements` prop after each add or
    // remove (all of them, each time): the page holds the elements itself, so that echo goes.
    cy.off('add remove dragfree');
    cy.on('tap', 'node', function (ev) { P.current = s; P.send('select', s, ev.target.id()); });
    cy.on('dbltap', 'node', function (ev) { P.current = s; P.send('toggle', s, ev.target.id()); });
    cy.on('tap', 'edge', function (ev) {
      var ed = ev.target;
      P.current = s;
      P.followed = ed.id();
      P.send('select', s, ed.data('target'), {via: ed.data('source')});
    });
    var following = false;
    cy.on('viewport', function () {
      if (quiet[s]) { return; }
      schedule(s);
      if (!following) {
        following = true;
        requestAnimationFrame(function () { following = false; follow(s); });
      }
    });
  }

  function schedule(s, reset, focus) {
    if (reset) { fresh[s] = true; }
    if (focus) { aim[s] = true; }
    if (pending[s]) { return; }
    pending[s] = true;
    requestAnimationFrame(function run() {
      if (!cyOf(s)) { requestAnimationFrame(run); return; }
      pending[s] = false;
      absolute(s);
      if (fresh[s]) { fresh[s] = false; home(s); }
      if (aim[s]) {
        aim[s] = false;
        if (P.side(s).sel != null) { centre(s, P.side(s).sel); }
      }
      sync(s);
    });
  }

  function minimap(s, cy) {
    var canvas = document.getElementById('g-mini-' + s);
    if (!canvas) { return; }
    var m = P.side(s), abs = absolute(s), b = m.bounds, ctx = canvas.getContext('2d');
    var colours = canvas._colours || (canvas._colours = JSON.parse(canvas.dataset.colours || '{}'));
    var W = canvas.width, H = canvas.height;
    ctx.clearRect(0, 0, W, H);
    if (!b || !b.w || !b.h) { return; }
    var k = Math.min((W - 4) / b.w, (H - 4) / b.h);
    canvas._k = k;
    m.nodes.forEach(function (e, n) {
      var a = abs.get(n), band = (/band-(\w+)/.exec(e.c) || [])[1];
      if (!a || (a.d > 1 && band !== 'error' && band !== 'nan')) { return; }
      ctx.fillStyle = e.o ? 'rgba(0,0,0,0.05)' : (colours[band] || '#ddd');
      ctx.fillRect(2 + a.x * k, 2 + a.y * k, Math.max(1, e.w * k), Math.max(1, e.hh * k));
    });
    var ext = cy.extent();
    ctx.strokeStyle = '#2563eb';
    ctx.lineWidth = 1.5;
    ctx.strokeRect(2 + ext.x1 * k, 2 + ext.y1 * k, (ext.x2 - ext.x1) * k, (ext.y2 - ext.y1) * k);
    if (!canvas._bound) {
      canvas._bound = true;
      canvas.addEventListener('click', function (ev) {
        var r = canvas.getBoundingClientRect(), c = cyOf(s);
        var x = (ev.clientX - r.left - 2) / canvas._k, y = (ev.clientY - r.top - 2) / canvas._k;
        move(s, function (cy2) { cy2.pan({x: cy2.width() / 2 - x * cy2.zoom(), y: cy2.height() / 2 - y * cy2.zoom()}); });
        if (c) { follow(s); }
      });
    }
  }

  P.graph = {cy: cyOf, schedule: schedule, absolute: absolute};
})();
