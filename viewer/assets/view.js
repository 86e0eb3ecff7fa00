// pvpo view: the page's script. The data block is parsed once; the list renders one page of rows,
// and an episode's turns only when its row is opened, so 10,000 episodes open as fast as 100.
// The view's state (filters, page, the open episode) lives in the URL's #fragment: a view can be
// bookmarked or sent, and a test opens the page on a given filter.
(function () {
  "use strict";
  var block = document.getElementById("pvpo-data");
  var D = JSON.parse(block.textContent);
  block.textContent = "";  // the parsed data are all the page needs: the text would double its memory
  var KIND = D.kind;
  var EPS = D.episodes;
  var PAGE = 50;
  var DEFAULTS = { outcome: "all", ds: "", ns: "", q: "", flip: "all", side: "either", step: "", gt: "all", page: "1", open: "" };
  var S = {};
  var haystacks = null;

  function esc(s) {
    return String(s == null ? "" : s).replace(/[&<>"']/g, function (c) {
      return { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c];
    });
  }
  function fmt(x, d) { return x == null || isNaN(x) ? "–" : Number(x).toFixed(d == null ? 3 : d); }
  function signed(x) { return x == null || isNaN(x) ? "–" : (x >= 0 ? "+" : "") + Number(x).toFixed(3); }
  function el(id) { return document.getElementById(id); }

  // ---- the list's entries: one per episode, or per question (two episodes) in a comparison ----
  var ENTRIES;
  if (KIND === "compare") {
    ENTRIES = D.pairs.map(function (p) {
      return { a: p[0] >= 0 ? EPS[0][p[0]] : null, b: p[1] >= 0 ? EPS[1][p[1]] : null, flip: p[2] };
    });
  } else {
    ENTRIES = EPS[0].map(function (e) { return { a: e, b: null, flip: "" }; });
  }
  ENTRIES.forEach(function (en) { en.key = (en.a || en.b).k; });

  // ---- state <-> URL fragment ----
  function readHash() {
    var p = new URLSearchParams(location.hash.replace(/^#/, ""));
    S = {};
    Object.keys(DEFAULTS).forEach(function (k) { S[k] = p.has(k) ? p.get(k) : DEFAULTS[k]; });
  }
  function writeHash() {
    var p = new URLSearchParams();
    Object.keys(DEFAULTS).forEach(function (k) { if (S[k] !== DEFAULTS[k]) p.set(k, S[k]); });
    var h = p.toString();
    try { history.replaceState(null, "", h ? "#" + h : location.pathname + location.search); } catch (e) { /* a sandboxed frame */ }
  }
  function set(changes, keepPage) {
    Object.keys(changes).forEach(function (k) { S[k] = String(changes[k]); });
    if (!keepPage) S.page = "1";
    writeHash();
    render();
  }

  // ---- filters ----
  function right(e) { return e.em >= 1; }
  var OUTCOMES = {
    all: function () { return true; },
    right: right,
    wrong: function (e) { return !right(e); },
    format_failed: function (e) { return e.fmt === false; },
    reach_missed: function (e) { return e.reach && !right(e); },
    no_search: function (e) { return e.ns === 0; }
  };
  var OUTCOME_LABELS = { all: "all", right: "right (EM 1)", wrong: "wrong", format_failed: "format failed",
    reach_missed: "answer in reach but missed", no_search: "no search" };
  function sides(en) {
    if (KIND !== "compare") return [en.a];
    if (S.side === "a") return [en.a];
    if (S.side === "b") return [en.b];
    return [en.a, en.b];
  }
  function hay(e) {
    if (!haystacks) haystacks = new Map();
    var h = haystacks.get(e);
    if (h === undefined) {
      var parts = [e.q, e.id, e.gold.join(" "), e.pred];
      e.turns.forEach(function (t) {
        if (t.x) parts.push(t.x);
        (t.p || []).forEach(function (p) { parts.push(p.title, p.text, p.id || ""); });
      });
      h = parts.join("\n").toLowerCase();
      haystacks.set(e, h);
    }
    return h;
  }
  function matches(en) {
    var test = OUTCOMES[S.outcome] || OUTCOMES.all;
    var ss = sides(en);
    var pick = KIND === "compare" && S.side === "both" ? "every" : "some";
    if (!ss.filter(Boolean)[pick](function (e) {
      return test(e) && (!S.ds || e.ds === S.ds) && (S.ns === "" || String(Math.min(e.ns, 5)) === S.ns);
    })) return false;
    if (KIND === "compare" && S.side === "both" && ss.some(function (e) { return !e; })) return false;
    if (KIND === "compare" && S.flip !== "all") {
      if (S.flip === "flipped" ? !(en.flip === "gained" || en.flip === "lost") : en.flip !== S.flip) return false;
    }
    if (KIND === "run") {
      if (S.step && String(en.a.step) !== S.step) return false;
      if (S.gt === "gt" && !en.a.gt) return false;
      if (S.gt === "policy" && en.a.gt) return false;
    }
    if (S.q) {
      var q = S.q.toLowerCase();
      if (![en.a, en.b].some(function (e) { return e && hay(e).indexOf(q) >= 0; })) return false;
    }
    return true;
  }

  // ---- summaries ----
  function stats(list) {
    var n = list.length, s = { n: n, em: 0, f1: 0, cem: 0, fmt: 0, fmtN: 0, reach: 0, missed: 0, ns: 0 };
    list.forEach(function (e) {
      s.em += e.em; s.f1 += e.f1; s.cem += e.cem; s.ns += e.ns;
      if (e.fmt != null) { s.fmtN++; if (e.fmt) s.fmt++; }
      if (e.reach) { s.reach++; if (!right(e)) s.missed++; }
    });
    if (n) { s.em /= n; s.f1 /= n; s.cem /= n; s.ns /= n; }
    return s;
  }
  function summaryRows(label, list) {
    var byDs = {};
    list.forEach(function (e) { (byDs[e.ds] = byDs[e.ds] || []).push(e); });
    var names = Object.keys(byDs).sort();
    var rows = names.length > 1 ? names.map(function (d) { return [label + " · " + (d || "–"), stats(byDs[d])]; }) : [];
    rows.push([label + (names.length > 1 ? " · all" : ""), stats(list)]);
    return rows;
  }
  // EM of B minus A over the questions both answered, with its paired standard error
  function paired() {
    var d = ENTRIES.filter(function (en) { return en.a && en.b; }).map(function (en) { return en.b.em - en.a.em; });
    if (!d.length) return "";
    var m = d.reduce(function (x, y) { return x + y; }, 0) / d.length;
    var v = d.length > 1 ? d.reduce(function (x, y) { return x + (y - m) * (y - m); }, 0) / (d.length - 1) : 0;
    return "EM B − A over " + d.length + " questions: " + signed(m) + " (paired s.e. " + fmt(Math.sqrt(v / d.length)) + ")";
  }
  function renderSummary() {
    var rows = [];
    D.sources.forEach(function (src, i) { rows = rows.concat(summaryRows((KIND === "compare" ? "AB"[i] + ": " : "") + src.label, EPS[i])); });
    var h = "<table class='summary'><tr><th>" + (KIND === "run" ? "kept episodes" : "episodes") +
      "</th><th class='num'>N</th><th class='num'>EM</th><th class='num'>F1</th><th class='num'>cover-EM</th>" +
      "<th class='num'>format</th><th class='num'>answer in reach</th><th class='num'>in reach, missed</th><th class='num'>searches</th></tr>";
    rows.forEach(function (r) {
      var s = r[1];
      h += "<tr><td>" + esc(r[0]) + "</td><td class='num'>" + s.n + "</td><td class='num'>" + fmt(s.em) +
        "</td><td class='num'>" + fmt(s.f1) + "</td><td class='num'>" + fmt(s.cem) + "</td><td class='num'>" +
        (s.fmtN ? fmt(s.fmt / s.fmtN) : "–") + "</td><td class='num'>" + (s.n ? fmt(s.reach / s.n) : "–") +
        "</td><td class='num'>" + s.missed + "</td><td class='num'>" + fmt(s.ns, 2) + "</td></tr>";
    });
    h += "</table>";
    if (KIND === "compare") {
      var c = { gained: 0, lost: 0, both: 0, neither: 0, only_a: 0, only_b: 0 };
      ENTRIES.forEach(function (en) { c[en.flip]++; });
      var flipLabels = [["all", "all " + ENTRIES.length], ["flipped", "flipped " + (c.gained + c.lost)],
        ["gained", "B right, A wrong " + c.gained], ["lost", "A right, B wrong " + c.lost],
        ["both", "both right " + c.both], ["neither", "both wrong " + c.neither]];
      if (c.only_a) flipLabels.push(["only_a", "only in A " + c.only_a]);
      if (c.only_b) flipLabels.push(["only_b", "only in B " + c.only_b]);
      h += "<div class='flips' id='flips'>" + flipLabels.map(function (f) {
        return "<button data-flip='" + f[0] + "' class='" + (S.flip === f[0] ? "on" : "") + "'>" + esc(f[1]) + "</button>";
      }).join("") + "<span class='legend' id='paired'>" + paired() + "</span></div>";
    }
    D.sources.forEach(function (src, i) {
      if (src.prompt) h += "<details class='prompt'><summary>" + (KIND === "compare" ? "AB"[i] + ": " : "") +
        "the prompt of the first question</summary><pre>" + esc(src.prompt) + "</pre></details>";
    });
    el("summary").innerHTML = h;
    var flips = el("flips");
    if (flips) flips.onclick = function (ev) { var f = ev.target.getAttribute("data-flip"); if (f) set({ flip: f }); };
  }

  // ---- training runs: curves, each step's groups ----
  function chart(title, series, bands) {
    var W = 460, H = 170, L = 34, R = 8, T = 8, B = 20;
    var xs = [], ys = [];
    series.forEach(function (s) { s.pts.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    (bands || []).forEach(function (b) { xs.push(b[0]); ys.push(b[1] - b[2], b[1] + b[2]); });
    if (!xs.length) return "";
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs), y0 = Math.min(0, Math.min.apply(null, ys)), y1 = Math.max(1, Math.max.apply(null, ys));
    if (x1 === x0) x1 = x0 + 1;
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return T + (1 - (v - y0) / (y1 - y0)) * (H - T - B); }
    var g = "<line x1='" + L + "' y1='" + Y(y0) + "' x2='" + (W - R) + "' y2='" + Y(y0) + "' stroke='#ccc'/>";
    [y0, (y0 + y1) / 2, y1].forEach(function (v) { g += "<text x='2' y='" + (Y(v) + 3) + "'>" + v.toFixed(2) + "</text>"; });
    g += "<text x='" + L + "' y='" + (H - 4) + "'>step " + x0 + "</text><text x='" + (W - R - 50) + "' y='" + (H - 4) + "'>step " + x1 + "</text>";
    (bands || []).forEach(function (b) {
      g += "<line x1='" + X(b[0]) + "' x2='" + X(b[0]) + "' y1='" + Y(b[1] - b[2]) + "' y2='" + Y(b[1] + b[2]) + "' stroke='#d97706'/>";
    });
    var legend = "";
    series.forEach(function (s) {
      if (!s.pts.length) return;
      var d = s.pts.map(function (p, i) { return (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join("");
      g += "<path d='" + d + "' fill='none' stroke='" + s.color + "' stroke-width='1.6'/>";
      if (s.dots) s.pts.forEach(function (p) { g += "<circle cx='" + X(p[0]) + "' cy='" + Y(p[1]) + "' r='2.5' fill='" + s.color + "'/>"; });
      legend += "<i style='background:" + s.color + "'></i>" + esc(s.name);
    });
    return "<div class='chart'><div class='ct'>" + esc(title) + "</div><svg width='" + W + "' height='" + H + "'>" + g +
      "</svg><div class='legend'>" + legend + "</div></div>";
  }
  function renderRun() {
    if (KIND !== "run") return;
    var run = D.run, c = run.curves;
    function pts(k) { return c.filter(function (r) { return r[k] != null; }).map(function (r) { return [r.step, r[k]]; }); }
    var val = run.validation.map(function (p) { return [p.step, p.accuracy, p.accuracy_se || 0]; });
    var h = "<h2>Training curves</h2><div class='charts'>" +
      chart("the step's rollouts", [{ name: "mean reward", color: "#1a56db", pts: pts("reward") },
        { name: "EM", color: "#137333", pts: pts("acc") }, { name: "format", color: "#9aa3b2", pts: pts("fmt") }]) +
      chart((val.length ? "validation EM (± s.e.)" : "evaluation EM") + (run.best ? ", best at step " + run.best.step : ""),
        [{ name: "validation EM", color: "#d97706", dots: true, pts: val.length ? val.map(function (p) { return [p[0], p[1]]; }) : pts("val") },
          { name: "evaluation EM", color: "#6b3fa0", dots: true, pts: pts("eval") }], val) +
      "</div>";
    var steps = run.steps;
    if (steps.length) {
      var cur = S.step ? steps.filter(function (s) { return String(s.step) === S.step; })[0] : steps[steps.length - 1];
      h += "<h2>The step's groups and advantages</h2><label>step <select id='stepsel'>" + steps.map(function (s) {
        return "<option value='" + s.step + "'" + (cur && s.step === cur.step ? " selected" : "") + ">" + s.step + "</option>";
      }).join("") + "</select></label> ";
      if (cur) h += groupsTable(cur);
    } else {
      h += "<p class='empty'>No episodes.jsonl in this run (run.keep_episodes: 0, or a run made before it existed).</p>";
    }
    el("run").innerHTML = h;
    var sel = el("stepsel");
    if (sel) sel.onchange = function () { set({ step: sel.value }); };
  }
  function groupsTable(step) {
    var groups = {}, order = [];
    step.rows.forEach(function (r) { if (!groups[r[0]]) { groups[r[0]] = []; order.push(r[0]); } groups[r[0]].push(r); });
    var questions = {};
    step.kept.forEach(function (i) { questions[EPS[0][i].uid] = EPS[0][i].q; });
    var h = "<table class='groups'><tr><th>group</th><th>question (kept episodes only)</th><th class='num'>mean reward</th><th>rows: reward / advantage</th></tr>";
    order.forEach(function (uid) {
      var rows = groups[uid], pol = rows.filter(function (r) { return !r[3]; });
      var mean = pol.length ? pol.reduce(function (a, r) { return a + (r[1] || 0); }, 0) / pol.length : null;
      h += "<tr><td>" + esc(uid) + "</td><td>" + esc(questions[uid] || "") + "</td><td class='num'>" + fmt(mean) + "</td><td>" +
        rows.map(function (r) {
          return "<span class='chip" + (r[1] >= 1 ? " r1" : "") + (r[3] ? " gt" : "") + "'>" + (r[3] ? "GT " : "") + fmt(r[1], 2) + " / " + signed(r[2]) + "</span>";
        }).join("") + "</td></tr>";
    });
    return h + "</table>";
  }

  // ---- the filter bar ----
  function options(values, cur, labels) {
    return values.map(function (v) {
      return "<option value='" + esc(v) + "'" + (String(v) === cur ? " selected" : "") + ">" + esc(labels ? labels[v] || v : v) + "</option>";
    }).join("");
  }
  function renderFilters() {
    var all = [].concat(EPS[0], EPS[1] || []);
    var dss = Array.from(new Set(all.map(function (e) { return e.ds; }))).sort();
    var h = "<label>outcome <select data-k='outcome'>" + options(Object.keys(OUTCOMES), S.outcome, OUTCOME_LABELS) + "</select></label>";
    if (KIND === "compare") h += "<label>of <select data-k='side'>" + options(["either", "a", "b", "both"], S.side, { either: "A or B", a: "A", b: "B", both: "A and B" }) + "</select></label>";
    if (dss.length > 1) h += "<label>dataset <select data-k='ds'><option value=''>all</option>" + options(dss, S.ds) + "</select></label>";
    h += "<label>searches <select data-k='ns'><option value=''>any</option>" + options(["0", "1", "2", "3", "4", "5"], S.ns, { 5: "5+" }) + "</select></label>";
    if (KIND === "run") {
      var steps = Array.from(new Set(EPS[0].map(function (e) { return e.step; }))).sort(function (a, b) { return a - b; });
      h += "<label>step <select data-k='step'><option value=''>all</option>" + options(steps, S.step) + "</select></label>";
      h += "<label>rows <select data-k='gt'>" + options(["all", "policy", "gt"], S.gt, { all: "all", policy: "policy samples", gt: "GT (injected)" }) + "</select></label>";
    }
    h += "<label>find <input type='search' id='find' placeholder='text in question, answers, turns, passages' value='" + esc(S.q) + "'></label>";
    h += "<span id='count'></span>";
    el("filters").innerHTML = h;
    Array.prototype.forEach.call(el("filters").querySelectorAll("select"), function (s) {
      s.onchange = function () { var c = {}; c[s.getAttribute("data-k")] = s.value; set(c); };
    });
    var timer = null, find = el("find");
    find.oninput = function () { clearTimeout(timer); timer = setTimeout(function () { S.q = find.value; S.page = "1"; writeHash(); renderList(); }, 150); };
  }

  // ---- the list ----
  function emBadge(e) {
    if (!e) return "<span class='badge unk'>absent</span>";
    return "<span class='badge " + (right(e) ? "ok'>EM 1" : "bad'>EM 0") + "</span>";
  }
  function fmtBadge(e) {
    return e.fmt == null ? "<span class='badge unk'>format ?</span>" : e.fmt ? "" : "<span class='badge bad'>format failed</span>";
  }
  var FLIP_LABELS = { gained: "B gained", lost: "B lost", both: "both right", neither: "both wrong", only_a: "only in A", only_b: "only in B" };
  function header() {
    if (KIND === "compare") return "<tr><th>#</th><th>dataset</th><th>question</th><th>gold</th><th>A: " + esc(D.sources[0].label) +
      "</th><th>B: " + esc(D.sources[1].label) + "</th><th>change</th></tr>";
    var h = "<tr><th>#</th>" + (KIND === "run" ? "<th class='num'>step</th>" : "<th>dataset</th>") +
      "<th>question</th><th>gold</th><th>prediction</th><th class='num'>EM</th><th class='num'>F1</th><th class='num'>cover-EM</th>";
    if (KIND === "run") h += "<th class='num'>reward</th><th class='num'>advantage</th>";
    return h + "<th class='num'>searches</th><th>end</th><th></th></tr>";
  }
  function row(en, i) {
    var e = en.a, cls = "ep-row" + (S.open === en.key ? " open" : "");
    var attrs = " data-key='" + esc(en.key) + "'" + (KIND === "compare" ? " data-flip='" + en.flip + "'" : "");
    var base = e || en.b;
    if (KIND === "compare") {
      return "<tr class='" + cls + "'" + attrs + "><td class='num'>" + (i + 1) + "</td><td>" + esc(base.ds) + "</td><td class='q'>" + esc(base.q) +
        "</td><td class='gold-list'>" + esc(base.gold.join(" | ")) + "</td><td class='pred'>" + emBadge(en.a) + " " + esc(en.a ? en.a.pred : "") +
        "</td><td class='pred'>" + emBadge(en.b) + " " + esc(en.b ? en.b.pred : "") + "</td><td><span class='badge flip-" + en.flip + "'>" +
        FLIP_LABELS[en.flip] + "</span></td></tr>";
    }
    var h = "<tr class='" + cls + "'" + attrs + " data-em='" + e.em + "'><td class='num'>" + (i + 1) + "</td>" +
      (KIND === "run" ? "<td class='num'>" + e.step + "</td>" : "<td>" + esc(e.ds) + "</td>") +
      "<td class='q'>" + (e.gt ? "<span class='badge gtb'>GT</span> " : "") + esc(e.q) + "</td><td class='gold-list'>" + esc(e.gold.join(" | ")) +
      "</td><td class='pred'>" + esc(e.pred) + "</td><td class='num'>" + emBadge(e) + "</td><td class='num'>" + fmt(e.f1, 2) +
      "</td><td class='num'>" + fmt(e.cem, 0) + "</td>";
    if (KIND === "run") h += "<td class='num'>" + fmt(e.r) + "</td><td class='num'>" + signed(e.adv) + "</td>";
    return h + "<td class='num'>" + e.ns + "</td><td>" + esc(e.stop) + "</td><td>" + fmtBadge(e) +
      (e.reach ? " <span class='badge goldb' title='a search returned a passage holding a golden answer'>in reach</span>" : "") + "</td></tr>";
  }
  function renderList() {
    var shown = ENTRIES.filter(matches);
    var pages = Math.max(1, Math.ceil(shown.length / PAGE));
    var page = Math.min(Math.max(1, parseInt(S.page, 10) || 1), pages);
    if (S.open) {  // an episode opened by a link shows on its own page
      var at = shown.findIndex(function (en) { return en.key === S.open; });
      if (at >= 0) page = Math.floor(at / PAGE) + 1;
    }
    var slice = shown.slice((page - 1) * PAGE, page * PAGE);
    var unit = KIND === "compare" ? "questions" : "episodes";
    el("count").textContent = shown.length + " of " + ENTRIES.length + " " + unit;
    function pager(top) {
      return "<div class='pager'><button data-page='" + (page - 1) + "'" + (page <= 1 ? " disabled" : "") + ">‹ prev</button>" +
        "page <b" + (top ? " id='page'" : "") + ">" + page + "</b> of " + pages + "<button data-page='" + (page + 1) + "'" +
        (page >= pages ? " disabled" : "") + ">next ›</button></div>";
    }
    var cols = KIND === "compare" ? 7 : KIND === "run" ? 13 : 11;
    var h = pager(true) + "<table id='episodes'>" + header();
    slice.forEach(function (en, k) {
      h += row(en, (page - 1) * PAGE + k);
      if (S.open === en.key) h += "<tr class='detail-row'><td class='detail' colspan='" + cols + "'>" + detail(en) + "</td></tr>";
    });
    h += "</table>";
    if (!slice.length) h += "<div class='empty'>No " + unit + " match these filters.</div>";
    el("list").innerHTML = h + (shown.length > PAGE ? pager(false) : "");
  }

  // ---- one episode ----
  var TAG = /<(\/?)(think|search|answer|information|result)>/g;
  function markup(text) {
    var out = "", at = 0, open = [], m;
    TAG.lastIndex = 0;
    while ((m = TAG.exec(text)) !== null) {
      out += esc(text.slice(at, m.index));
      if (!m[1]) { out += "<span class='tag'>&lt;" + m[2] + "&gt;</span><span class='blk-" + m[2] + "'>"; open.push(m[2]); }
      else if (open.length && open[open.length - 1] === m[2]) { out += "</span><span class='tag'>&lt;/" + m[2] + "&gt;</span>"; open.pop(); }
      else out += "<span class='tag'>&lt;/" + m[2] + "&gt;</span>";
      at = TAG.lastIndex;
    }
    out += esc(text.slice(at));
    open.forEach(function () { out += "</span>"; });
    return out;
  }
  function highlight(text, golds) {
    var lower = text.toLowerCase(), marks = [];
    golds.forEach(function (g) {
      g = String(g).trim().toLowerCase();
      if (g.length < 2 || /^(yes|no|true|false)$/.test(g)) return;
      for (var i = lower.indexOf(g); i >= 0; i = lower.indexOf(g, i + g.length)) marks.push([i, i + g.length]);
    });
    if (!marks.length) return esc(text);
    marks.sort(function (a, b) { return a[0] - b[0]; });
    var out = "", at = 0;
    marks.forEach(function (m) { if (m[0] >= at) { out += esc(text.slice(at, m[0])) + "<mark>" + esc(text.slice(m[0], m[1])) + "</mark>"; at = m[1]; } });
    return out + esc(text.slice(at));
  }
  function lastSearch(text) {
    var m = text.match(/<search>([\s\S]*?)<\/search>\s*$/);
    return m ? m[1].trim() : null;
  }
  function episode(e, title) {
    if (!e) return "<div class='episode'><h3>" + esc(title) + "</h3><p class='empty'>not in this folder</p></div>";
    var f = ["EM " + fmt(e.em, 0), "F1 " + fmt(e.f1, 2), "cover-EM " + fmt(e.cem, 0),
      e.fmt == null ? "format unknown" : e.fmt ? "format ok" : "format failed", "ended: " + (e.stop || "–"),
      e.ns + (e.ns === 1 ? " search" : " searches"), e.nt + (e.nt === 1 ? " turn" : " turns")];
    if (e.tok != null) f.push(e.tok + " tokens");
    f.push(e.reach ? "a golden answer was in reach" : "no golden answer in the passages");
    if (e.r != null) f.push("reward " + fmt(e.r));
    if (e.rc) Object.keys(e.rc).forEach(function (k) { f.push(k + " " + fmt(e.rc[k], 2)); });
    if (e.adv != null) f.push("advantage " + signed(e.adv));
    if (e.gt) f.push("GT row (injected)");
    if (e.pi) f.push("pi_gt: log-prob " + fmt(e.pi.logprob, 2) + " over " + e.pi.tokens + " tokens (" + fmt(e.pi.logprob_per_token, 3) + " per token, " + (e.pi.source || "–") + ")");
    var h = "<div class='episode' data-key='" + esc(e.k) + "'><h3>" + esc(title) + "</h3>" +
      "<div><b>" + esc(e.q) + "</b></div><div>gold: <span class='gold-list'>" + esc(e.gold.join(" | ")) + "</span> · answer: <b>" + esc(e.pred || "–") + "</b></div>" +
      "<div class='facts'>" + f.map(function (x) { return "<span>" + esc(x) + "</span>"; }).join("") + "</div>";
    var query = null, n = 0;
    e.turns.forEach(function (t) {
      if (t.t === "m") {
        n++;
        query = lastSearch(t.x);
        h += "<div class='turn turn-model'><div class='who'>model, turn " + n + "</div><pre>" + markup(t.x) + "</pre></div>";
      } else if (t.t === "o") {
        h += "<div class='turn turn-obs'><div class='who'>search results" + (query != null ? " for <span class='search-query'>" + esc(query) + "</span>" : "") + "</div>";
        if (!t.p.length) h += "<pre>" + highlight(t.x || "", e.gold) + "</pre>";
        t.p.forEach(function (p) {
          h += "<div class='passage" + (p.gold ? " gold" : "") + "' data-id='" + esc(p.id || "") + "' data-gold='" + (p.gold ? 1 : 0) + "'><div class='ph'>[" + p.n + "] <b>" +
            esc(p.title) + "</b>" + (p.id ? "<span class='pid'>id " + esc(p.id) + "</span>" : "") +
            (p.score != null ? "<span class='score'>score " + fmt(p.score, 3) + "</span>" : "") +
            (p.gold ? " <span class='badge goldb'>golden answer</span>" : "") + "</div><div class='pt'>" + highlight(p.text, e.gold) + "</div></div>";
        });
        h += "</div>";
      } else {
        h += "<div class='turn turn-corr'><div class='who'>env correction</div><pre>" + esc(t.x) + "</pre></div>";
      }
    });
    return h + "</div>";
  }
  function detail(en) {
    if (KIND !== "compare") return episode(en.a, "");
    return "<div class='pair'>" + episode(en.a, "A: " + D.sources[0].label) + episode(en.b, "B: " + D.sources[1].label) + "</div>";
  }

  // ---- the page ----
  function renderHeader() {
    var what = { eval: "evaluation", compare: "comparison", run: "training run" }[KIND];
    el("top").innerHTML = "<h1>pvpo view: " + what + "</h1>" + D.sources.map(function (s, i) {
      return "<div class='src'>" + (KIND === "compare" ? "<b>" + "AB"[i] + "</b> " : "") + "<b>" + esc(s.label) + "</b> " + esc(s.path) + "</div>";
    }).join("") + "<div class='src'>written " + esc(D.generated) + "</div>";
  }
  function render() {
    renderSummary();
    renderRun();
    renderFilters();
    renderList();
  }
  el("list").addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-page]");
    if (b) { set({ page: b.getAttribute("data-page"), open: "" }, true); window.scrollTo(0, el("filters").offsetTop); return; }
    if (ev.target.closest(".detail-row")) return;
    var tr = ev.target.closest("tr.ep-row");
    if (tr) set({ open: S.open === tr.getAttribute("data-key") ? "" : tr.getAttribute("data-key") }, true);
  });
  window.addEventListener("hashchange", function () { readHash(); render(); });
  readHash();
  renderHeader();
  render();
  document.documentElement.setAttribute("data-ready-ms", String(Math.round(performance.now())));
})();
