// The graph-diff trees and filter list are drawn here from compact row data (one Dash store per
// list), not as Dash components: thousands of rows then cost one innerHTML, and a click on any
// of them is handed back to Dash through the g-click store (one listener for all).
(function () {
  function esc(s) {
    return String(s).replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
      .replace(/"/g, '&quot;');
  }

  // rows: [{n: node, l: label, d: depth, c: classes, k: has children, o: open, h: hint state,
  //         a: label of the node an affected one comes from, an: its name}]
  window.probeRenderTree = function (id, side, rows) {
    var box = document.getElementById(id);
    if (!box || !rows) { return ''; }
    var out = [];
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i], node = esc(r.n), at = ' data-side="' + side + '" data-node="' + node + '"';
      var tog = r.k ? '<span class="tog" data-act="toggle"' + at + '>' + (r.o ? '▾' : '▸') + '</span>'
                    : '<span class="tog leaf"></span>';
      var hint = r.h ? '<span class="hint hint-' + r.h + '" title="' + r.h + ' inside">●</span>' : '';
      if (r.a) {
        hint += '<span class="aff" title="affected by ' + esc(r.an) + '">↳ ' + esc(r.a) + '</span>';
      }
      out.push('<div class="' + r.c + '" data-node="' + node + '" style="padding-left:' + (r.d * 14 + 4) +
               'px">' + tog + '<span class="lbl" data-act="select"' + at + ' title="' + node + '">' +
               esc(r.l) + '</span>' + hint + '</div>');
    }
    box.innerHTML = out.join('');
    var sel = box.querySelector('.row.sel');
    if (sel) {
      var top = sel.offsetTop, h = sel.offsetHeight;
      if (top < box.scrollTop || top + h > box.scrollTop + box.clientHeight) {
        box.scrollTop = Math.max(0, top - box.clientHeight / 3);
      }
    }
    return String(rows.length);
  };

  // items: [{s: side, n: node, l: text, c: classes}]
  window.probeRenderList = function (id, items) {
    var box = document.getElementById(id);
    if (!box || !items) { return ''; }
    box.innerHTML = items.map(function (it) {
      return '<div class="' + it.c + '" data-act="select" data-side="' + it.s + '" data-node="' +
             esc(it.n) + '" title="' + esc(it.n) + '">' + esc(it.l) + '</div>';
    }).join('');
    return String(items.length);
  };

  document.addEventListener('click', function (e) {
    var el = e.target.closest('[data-act]');
    if (!el || !window.dash_clientside || !window.dash_clientside.set_props) { return; }
    window.dash_clientside.set_props('g-click', {
      data: {act: el.dataset.act, side: el.dataset.side, node: el.dataset.node, t: Date.now()}
    });
  });
})();
