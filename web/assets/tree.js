// The graph-diff trees and the filter list, windowed: only the rows in (and near) the scrolled
// view are in the page, so a tree of 10k visible nodes costs what one of 100 does. Rows are
// drawn from the client model (view_model.js); a click on a row is handed to Dash by the one
// listener there.
(function () {
  var P = window.probe = window.probe || {};
  var ROW = 21, OVER = 40, INDENT = 14;

  function esc(s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;');
  }

  // Windowed list in box: total rows n, draw(i, top) returns the HTML of row i at pixel top.
  function windowed(box, n, draw) {
    var inner = box.firstElementChild;
    if (!inner || !inner.classList.contains('vlist')) {
      box.innerHTML = '<div class="vlist"></div>';
      inner = box.firstElementChild;
      box.addEventListener('scroll', function () {
        if (!box._pending) {
          box._pending = true;
          requestAnimationFrame(function () { box._pending = false; box._draw(); });
        }
      });
    }
    box._draw = function () {
      var first = Math.max(0, Math.floor(box.scrollTop / ROW) - OVER);
      var last = Math.min(n, Math.ceil((box.scrollTop + box.clientHeight) / ROW) + OVER);
      var out = [];
      for (var i = first; i < last; i++) { out.push(draw(i, i * ROW)); }
      inner.style.height = (n * ROW) + 'px';
      inner.innerHTML = out.join('');
    };
    box._draw();
  }

  function rowHtml(s, e, depth, top) {
    var node = esc(e.n), at = ' data-side="' + s + '" data-node="' + node + '"';
    var tog = e.k ? '<span class="tog" data-act="toggle"' + at + '>' + (e.o ? '▾' : '▸') + '</span>'
                  : '<span class="tog leaf"></span>';
    var hint = e.h ? '<span class="hint hint-' + e.h + '" title="' + e.h + ' inside">●</span>' : '';
    if (e.a) { hint += '<span class="aff" title="affected by ' + esc(e.an) + '">↳ ' + esc(e.a) + '</span>'; }
    return '<div class="row ' + e.c + P.marks(s, e.n) + '" data-node="' + node + '" style="top:' + top +
           'px;padding-left:' + (depth * INDENT + 4) + 'px">' + tog + '<span class="lbl" data-act="select"' +
           at + ' title="' + node + '">' + esc(e.l) + '</span>' + hint + '</div>';
  }

  P.tree = {
    render: function (s, focus) {
      var box = document.getElementById('g-tree-' + s);
      if (!box) { return; }
      var m = P.side(s), flat = P.flat(s), depths = new Map();
      windowed(box, flat.length, function (i, top) {
        var e = m.nodes.get(flat[i]);
        var d = e.p == null ? 0 : (depths.get(e.p) != null ? depths.get(e.p) + 1 : P.depth(s, e.n));
        depths.set(e.n, d);
        return rowHtml(s, e, d, top);
      });
      if (focus && m.sel != null && m.index.has(m.sel)) {
        var top = m.index.get(m.sel) * ROW;
        if (top < box.scrollTop || top + ROW > box.scrollTop + box.clientHeight) {
          box.scrollTop = Math.max(0, top - box.clientHeight / 3);
          box._draw();
        }
      }
    }
  };

  // items: [{s: side, n: node, l: text, c: classes}]
  window.probeRenderList = function (id, items) {
    var box = document.getElementById(id);
    if (!box || !items) { return ''; }
    windowed(box, items.length, function (i, top) {
      var it = items[i];
      return '<div class="' + it.c + '" style="top:' + top + 'px" data-act="select" data-side="' + it.s +
             '" data-node="' + esc(it.n) + '" title="' + esc(it.n) + '">' + esc(it.l) + '</div>';
    });
    return String(items.length);
  };
})();
