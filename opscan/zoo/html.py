"""The leaderboard as one self-contained HTML page (a pure function of the Leaderboard; nothing fetched).

A model x release grid, each cell coloured by its lane and marked P (predicted) or M (measured); error rows span
the grid with their reason. Clicking a column header sorts by it (release columns by lane: mac-first first);
clicking a cell shows its lane, why, where it comes from, and its blocking rows with their evidence. The blocking
rows are stored once (`rows`) and cells point at them, so a family of hundreds of models stays small. For tests
and links, `#open=MODEL@RELEASE` clicks that cell and `#sort=N` clicks header N once the page is ready.
"""

from __future__ import annotations

import json
from opscan.trust.text import html_text as escape

from opscan.trust.text import script_json
from opscan.zoo.board import Leaderboard, ModelResult

LANE_RANK = {"mac-first": 0, "dual-track": 1, "linux-gpu-first": 2}
SHORT = {"mac-first": "mac", "dual-track": "dual", "linux-gpu-first": "gpu"}
FIXED = ("model", "family", "first native", "seconds")

CSS = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
table{border-collapse:collapse}th,td{border:1px solid #ccc;padding:2px 5px;white-space:nowrap}
th{background:#eee;cursor:pointer;position:sticky;top:0}td.cell{cursor:pointer;text-align:center;font-size:11px}
.lane-mac-first{background:#b7e4b0}.lane-dual-track{background:#f7e08f}.lane-linux-gpu-first{background:#f2a7a0}
td.error{background:#ddd;color:#555;white-space:normal}td.cell.selected{outline:2px solid #000}
sup{font-size:9px;color:#444}#detail{margin-top:16px}#detail td{white-space:normal;vertical-align:top}
.legend span{padding:2px 6px;margin-right:6px}
"""

JS = """
(function(){
var errors=[];window.addEventListener('error',function(e){errors.push(e.message);
 document.body.setAttribute('data-js-errors',errors.length);});
var data=JSON.parse(document.getElementById('zoo-data').textContent);
function cellOf(key){return data.cells[key];}
function show(td){
 document.querySelectorAll('td.selected').forEach(function(x){x.classList.remove('selected');});
 td.classList.add('selected');var c=cellOf(td.dataset.key);var d=document.getElementById('detail');
 var h='<h2>'+esc(td.dataset.key)+': '+esc(c.lane)+' ('+esc(c.source)+')</h2><p>'+esc(c.origin)+'</p><ul>';
 c.lane_why.forEach(function(w){h+='<li>'+esc(w)+'</li>';});h+='</ul>';
 if(!c.blocking.length){h+='<p class="none">No blocking rows: every row of the step is native.</p>';}
 else{h+='<table class="blocking"><tr><th>op</th><th>dtypes</th><th>verdict</th><th>rule</th><th>evidence</th>'+
  '<th>source</th><th>verdict source</th></tr>';
  c.blocking.forEach(function(i){var b=data.rows[i];h+='<tr><td>'+esc(b.op)+'</td><td>'+esc(b.dtypes.join(','))+
  '</td><td>'+esc(b.verdict)+'</td><td>'+esc(b.rule)+'</td><td>'+esc(b.evidence)+'</td><td>'+esc(b.source)+
  '</td><td>'+esc(b.verdict_source)+'</td></tr>';});h+='</table>';}
 d.innerHTML=h;d.setAttribute('data-shown',td.dataset.key);}
function esc(s){return String(s).replace(/[&<>"]/g,function(ch){return {'&':'&amp;','<':'&lt;','>':'&gt;',
 '"':'&quot;'}[ch];});}
function sortBy(th){var i=Array.prototype.indexOf.call(th.parentNode.children,th);var body=document.querySelector(
 '#board tbody');var rows=Array.prototype.slice.call(body.rows);var up=th.dataset.dir!=='asc';
 th.parentNode.querySelectorAll('th').forEach(function(x){delete x.dataset.dir;});th.dataset.dir=up?'asc':'desc';
 rows.sort(function(a,b){var x=key(a,i),y=key(b,i);var r=(x<y?-1:x>y?1:0);return up?r:-r;});
 rows.forEach(function(r){body.appendChild(r);});document.getElementById('board').setAttribute('data-sorted',i);}
function key(row,i){var td=row.cells[Math.min(i,row.cells.length-1)];var v=td.dataset.sort;
 if(v===undefined){v=td.textContent;}var n=parseFloat(v);return isNaN(n)?v:n;}
document.querySelectorAll('td.cell').forEach(function(td){td.addEventListener('click',function(){show(td);});});
document.querySelectorAll('#board th').forEach(function(th){th.addEventListener('click',function(){sortBy(th);});});
var hash=decodeURIComponent(location.hash.slice(1));var m=/^open=(.+)$/.exec(hash);
if(m){var td=document.querySelector('td.cell[data-key="'+m[1].replace(/"/g,'')+'"]');if(td){td.click();}}
var s=/^sort=(\\d+)$/.exec(hash);if(s){document.querySelectorAll('#board th')[+s[1]].click();}
document.body.setAttribute('data-ready','true');
})();
"""


def render_html(board: Leaderboard) -> str:
    """The page (see the module docstring)."""
    rows, index, cells = [], {}, {}
    for m in board.models:
        for c in m.cells:
            refs = []
            for b in c.result.blocking:
                data = b.to_dict()
                token = json.dumps(data, sort_keys=True)
                if token not in index:
                    index[token] = len(rows)
                    rows.append(data)
                refs.append(index[token])
            cells[f"{m.model.name}@{c.result.release}"] = {**c.to_dict(), "blocking": refs}
    payload = script_json({"rows": rows, "cells": cells}, separators=(",", ":"))  # no <, >, & in the block
    counts = board.counts()
    head = "".join(f"<th>{escape(name)}</th>" for name in (*FIXED, *board.releases))
    body = "\n".join(_row(m, board) for m in board.models)
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>opscan zoo: {escape(board.title)}</title>"
            f"<style>{CSS}</style></head><body>\n<h1>opscan zoo: {escape(board.title)}</h1>\n"
            f"<p>opscan {escape(board.opscan)}, {escape(board.created)}: {counts['models']} models "
            f"({counts['errors']} could not be scanned) x {len(board.releases)} releases; {counts['cells']} cells, "
            f"<span id=\"predicted\">{counts['predicted']}</span> predicted, "
            f"<span id=\"measured\">{counts['measured']}</span> measured (P / M in each cell).</p>\n"
            "<p class=\"legend\"><span class=\"lane-mac-first\">mac-first</span><span class=\"lane-dual-track\">"
            "dual-track</span><span class=\"lane-linux-gpu-first\">linux-gpu-first</span>Click a header to sort, "
            "a cell for its blocking rows.</p>\n"
            f"<table id=\"board\"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>\n"
            "<section id=\"detail\"></section>\n"
            f"<script type=\"application/json\" id=\"zoo-data\">{payload}</script>\n<script>{JS}</script>"
            "</body></html>\n")


def _row(m: ModelResult, board: Leaderboard) -> str:
    name = escape(m.model.name)
    first = m.first_native(board.releases)
    fixed = (f"<td>{name}</td><td>{escape(m.model.source)}</td>"
             f"<td data-sort=\"{escape(first or '~')}\">{escape(first or '-')}</td>"
             f"<td data-sort=\"{m.seconds:.1f}\">{m.seconds:.1f}</td>")
    if m.error:
        return (f"<tr data-model=\"{name}\">{fixed}<td class=\"error\" data-sort=\"9\" "
                f"colspan=\"{max(1, len(board.releases))}\">{escape(m.error)}</td></tr>")
    tds = []
    for release in board.releases:
        c = m.cell(release)
        if c is None:
            tds.append("<td data-sort=\"8\">-</td>")
            continue
        lane, mark = c.result.lane, "M" if c.source == "measured" else "P"
        tds.append(f"<td class=\"cell lane-{escape(lane)}\" data-key=\"{name}@{escape(release)}\" "
                   f"data-sort=\"{LANE_RANK.get(lane, 3)}\" data-source=\"{c.source}\" "
                   f"title=\"{escape(lane)} ({c.source}), {len(c.result.blocking)} blocking rows\">"
                   f"{SHORT.get(lane, escape(lane))}<sup>{mark}</sup></td>")
    return f"<tr data-model=\"{name}\">{fixed}{''.join(tds)}</tr>"
