// distlab's course site: search across every notebook (the index is a script, loaded on first
// use, so that it works from file:// as well as from a server), and the contents list folded
// on a narrow screen.
(function () {
  "use strict";
  var input, panel, index = null, waiting = [];

  function loadIndex(then) {
    if (index) return then();
    waiting.push(then);
    if (waiting.length > 1) return;
    var script = document.createElement("script");
    script.src = "assets/search-index.js";
    script.onload = function () {
      index = window.DISTLAB_SEARCH.map(function (e) {
        return { page: e[0], anchor: e[1], title: e[2], heading: e[3], text: e[4],
                 lower: (e[3] + " " + e[4]).toLowerCase() };
      });
      waiting.splice(0).forEach(function (f) { f(); });
    };
    document.head.appendChild(script);
  }

  function escapeHtml(s) {
    return s.replace(/[&<>"]/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" }[c];
    });
  }

  function snippet(entry, terms) {
    var at = entry.text.toLowerCase().indexOf(terms[0]);
    var start = Math.max(0, at - 60), text = entry.text.slice(start, start + 180);
    var html = escapeHtml((start > 0 ? "…" : "") + text + (start + 180 < entry.text.length ? "…" : ""));
    terms.forEach(function (t) {
      var re = new RegExp("(" + t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&") + ")", "gi");
      html = html.replace(re, "<mark>$1</mark>");
    });
    return html;
  }

  function search() {
    var query = input.value.trim().toLowerCase();
    if (!query) { panel.hidden = true; return; }
    var terms = query.split(/\s+/);
    var hits = [];
    index.forEach(function (e) {
      if (terms.every(function (t) { return e.lower.indexOf(t) >= 0; })) {
        var score = terms.reduce(function (s, t) {
          return s + e.lower.split(t).length - 1 + (e.heading.toLowerCase().indexOf(t) >= 0 ? 5 : 0);
        }, 0);
        hits.push([score, e]);
      }
    });
    hits.sort(function (a, b) { return b[0] - a[0]; });
    panel.innerHTML = hits.length ? hits.slice(0, 30).map(function (h) {
      var e = h[1];
      return '<a href="' + e.page + (e.anchor ? "#" + e.anchor : "") + '"><span class="where">' +
        escapeHtml(e.title) + "</span>" + (e.heading ? " · " + escapeHtml(e.heading) : "") +
        '<span class="snippet">' + snippet(e, terms) + "</span></a>";
    }).join("") : '<div class="none">Nothing found for “' + escapeHtml(query) + '”.</div>';
    panel.hidden = false;
  }

  document.addEventListener("DOMContentLoaded", function () {
    input = document.getElementById("search");
    panel = document.getElementById("search-results");
    input.addEventListener("focus", function () { loadIndex(function () {}); });
    input.addEventListener("input", function () { loadIndex(search); });
    input.addEventListener("keydown", function (event) {
      if (event.key === "Enter") {
        var first = panel.querySelector("a");
        if (first) window.location.href = first.getAttribute("href");
      } else if (event.key === "Escape") {
        panel.hidden = true;
      }
    });
    document.addEventListener("click", function (event) {
      if (!event.target.closest(".search")) panel.hidden = true;
    });
    var toc = document.querySelector("details.toc");
    if (toc && window.matchMedia("(max-width: 900px)").matches) toc.open = false;
  });
})();
