"""Render stage: the HTML report's inline stylesheet and scripts (one file, nothing fetched when viewed)."""

from __future__ import annotations

# First script of the page: every uncaught error or rejected promise is kept in the DOM (#opscan-errors,
# html[data-js-errors]) so that a headless browser's --dump-dom shows it.
ERROR_HOOK = """
(function () {
  var count = 0;
  function keep(text) {
    count += 1;
    document.documentElement.setAttribute('data-js-errors', String(count));
    var box = document.getElementById('opscan-errors');
    if (box) { var li = document.createElement('li'); li.textContent = text; box.appendChild(li); }
    else { (window.__opscanPending = window.__opscanPending || []).push(text); }
  }
  window.addEventListener('error', function (e) { keep('error: ' + e.message); });
  window.addEventListener('unhandledrejection', function (e) { keep('rejection: ' + e.reason); });
  var original = console.error;
  console.error = function () { keep('console.error: ' + Array.prototype.join.call(arguments, ' '));
                                return original.apply(console, arguments); };
})();
"""

# Last script: flush early errors, record where the drawn graphs are (for screenshot checks), filter the
# op table as the user types.
PAGE_SCRIPT = """
(function () {
  var box = document.getElementById('opscan-errors');
  (window.__opscanPending || []).forEach(function (t) { var li = document.createElement('li');
    li.textContent = t; box.appendChild(li); });
  var graphs = document.querySelectorAll('svg.graph');
  document.body.setAttribute('data-graphs', String(graphs.length));
  if (graphs.length) {
    var r = graphs[0].getBoundingClientRect();
    document.body.setAttribute('data-first-graph', [Math.round(r.left + window.scrollX),
      Math.round(r.top + window.scrollY), Math.round(r.width), Math.round(r.height)].join(','));
  }
  var filter = document.getElementById('op-filter');
  if (filter) {
    filter.addEventListener('input', function () {
      var q = filter.value.toLowerCase();
      document.querySelectorAll('#ops tbody tr').forEach(function (tr) {
        tr.style.display = tr.textContent.toLowerCase().indexOf(q) >= 0 ? '' : 'none';
      });
    });
  }
  document.body.setAttribute('data-ready', 'true');
})();
"""

STYLE = """
:root { --native:#2e7d32; --unknown:#b58900; --cpu_fallback:#d2691e; --unsupported:#c62828;
  --unsupported_dtype:#c62828; --mismatch:#8e24aa; --error:#8e24aa; --crash:#4a148c; --timeout:#4a148c; }
* { box-sizing: border-box; }
body { font: 14px/1.45 -apple-system, "Segoe UI", Roboto, Helvetica, Arial, sans-serif; margin: 0; color: #1d232a;
  background: #f6f7f9; }
header, section { max-width: 1240px; margin: 0 auto; padding: 12px 20px; }
header { padding-top: 20px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 18px 0 8px; } h3 { font-size: 15px; margin: 0; }
.meta { color: #56606b; }
.pills { display: flex; flex-wrap: wrap; gap: 6px; }
.pill { border-radius: 12px; padding: 2px 10px; background: #fff; border: 1px solid #d0d5db; }
.pill b { margin-right: 4px; }
.lane { display: inline-block; font-weight: 600; padding: 3px 12px; border-radius: 4px; color: #fff; }
.lane-mac-first { background: var(--native); } .lane-dual-track { background: var(--cpu_fallback); }
.lane-linux-gpu-first { background: var(--unsupported); }
.v { font-weight: 600; } .v-native { color: var(--native); } .v-unknown { color: var(--unknown); }
.v-cpu_fallback { color: var(--cpu_fallback); } .v-unsupported, .v-unsupported_dtype { color: var(--unsupported); }
.v-mismatch, .v-error { color: var(--error); } .v-crash, .v-timeout { color: var(--crash); }
table { border-collapse: collapse; background: #fff; width: 100%; }
th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e3e6ea; vertical-align: top;
  overflow-wrap: anywhere; }
th { background: #eef1f4; font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.card { background: #fff; border: 1px solid #d8dde3; border-radius: 6px; padding: 12px 14px; margin: 10px 0; }
.graph-box { overflow-x: auto; margin-top: 8px; }
svg.graph { max-width: 100%; height: auto; background: #fff; }
svg .lane-bg { fill: #f3f5f8; stroke: #dde2e8; } svg .lane-label { font: 600 12px sans-serif; fill: #37414b; }
svg .lane-type { font: 11px sans-serif; fill: #7a858f; }
svg .node rect { stroke-width: 1.5; } svg .node text { font: 12px sans-serif; fill: #1d232a; }
svg .node text.sub { font-size: 10px; fill: #56606b; }
svg .verdict-native rect { fill: #dff3e3; stroke: var(--native); }
svg .verdict-unknown rect { fill: #fff4c7; stroke: var(--unknown); }
svg .verdict-cpu_fallback rect { fill: #ffe2c6; stroke: var(--cpu_fallback); }
svg .verdict-unsupported rect, svg .verdict-unsupported_dtype rect { fill: #ffd9d9; stroke: var(--unsupported); }
svg .verdict-error rect, svg .verdict-mismatch rect, svg .verdict-crash rect, svg .verdict-timeout rect {
  fill: #f6d8ff; stroke: var(--error); }
svg .verdict-source rect { fill: #e9edf1; stroke: #7b8894; }
svg .node.focus rect { stroke: #d50000; stroke-width: 4; }
svg path.edge { fill: none; stroke: #9aa5b1; stroke-width: 1.4; }
svg path.edge.crossing { stroke: #d2691e; stroke-width: 2.4; stroke-dasharray: 6 3; }
ul.tree { list-style: none; padding-left: 16px; margin: 2px 0; } ul.tree li { margin: 1px 0; }
.dot { display: inline-block; width: 9px; height: 9px; border-radius: 50%; margin-right: 5px; background: #c5ccd3; }
.bar { height: 14px; background: #e3e6ea; border-radius: 3px; position: relative; }
.bar span { position: absolute; left: 0; top: 0; bottom: 0; background: var(--cpu_fallback); border-radius: 3px; }
input#op-filter { padding: 4px 8px; width: 260px; margin-bottom: 6px; }
.small { font-size: 12px; color: #56606b; } code { font-size: 12px; }
pre.source { background: #f4f6f8; border-left: 3px solid #c9d1d9; padding: 4px 8px; margin: 4px 0; overflow-x: auto; }
ul.parts { margin: 4px 0; }
#opscan-errors:empty { display: none; }
"""
