// pvpo view: the page's script. The data block is parsed once; the list renders one page of rows,
// and an episode's turns only when its row is opened, so 10,000 episodes open as fast as 100.
// The view's state (filters, sort, page, the open episode) lives in the URL's #fragment: a view can
// be bookmarked or sent, a test opens the page on a given filter, and each change is a history
// entry, so the browser's Back undoes it.
(function () {
  "use strict";
  var block = document.getElementById("pvpo-data");
  var D = JSON.parse(block.textContent);
  block.textContent = "";  // the parsed data are all the page needs: the text would double its memory
  var KIND = D.kind;
  var EPS = D.episodes;
  var PAGE = 50;
  var DEFAULTS = { outcome: "all", ds: "", ns: "", q: "", flip: "all", by: "em", side: "either", step: "", gt: "all",
    group: "", sort: "", tok: "", page: "1", open: "" };
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
  function mean(xs) { return xs.length ? xs.reduce(function (a, b) { return a + b; }, 0) / xs.length : null; }

  // ---- the list's entries: one per episode, or per question (two episodes) in a comparison ----
  var ENTRIES;
  if (KIND === "compare") {
    ENTRIES = D.pairs.map(function (p) {
      return { a: p[0] >= 0 ? EPS[0][p[0]] : null, b: p[1] >= 0 ? EPS[1][p[1]] : null };
    });
  } else {
    ENTRIES = EPS[0].map(function (e) { return { a: e, b: null }; });
  }
  // a question's key is A's episode's; one only B answered keeps B's, set apart where A's episodes
  // use the same key for another question (two files paired by question text, keyed by position)
  var aKeys = new Set(EPS[0].map(function (e) { return e.k; }));
  ENTRIES.forEach(function (en) { en.key = en.a ? en.a.k : (aKeys.has(en.b.k) ? "B:" : "") + en.b.k; });

  // what became of a question from A to B by a score: EM and cover-EM are right at 1; F1 is
  // compared as a number ("gained" = B higher, "both" = equal and above 0)
  var BY = { em: "EM", cem: "cover-EM", f1: "F1" };
  function flipOf(en, by) {
    if (!en.a || !en.b) return en.a ? "only_a" : "only_b";
    var a = en.a[by], b = en.b[by];
    if (by !== "f1") { a = a >= 1 ? 1 : 0; b = b >= 1 ? 1 : 0; }
    if (Math.abs(b - a) > 1e-9) return b > a ? "gained" : "lost";
    return a > 0 ? "both" : "neither";
  }
  function flip(en) { return flipOf(en, BY[S.by] ? S.by : "em"); }

  // ---- state <-> URL fragment; each change a history entry ----
  function readHash() {
    var p = new URLSearchParams(location.hash.replace(/^#/, ""));
    S = {};
    Object.keys(DEFAULTS).forEach(function (k) { S[k] = p.has(k) ? p.get(k) : DEFAULTS[k]; });
  }
  function hashOf() {
    var p = new URLSearchParams();
    Object.keys(DEFAULTS).forEach(function (k) { if (S[k] !== DEFAULTS[k]) p.set(k, S[k]); });
    var h = p.toString();
    return h ? "#" + h : location.pathname + location.search;
  }
  var typing = false;  // a run of keystrokes in "find" is one history entry
  function writeHash(replace) {
    var url = hashOf();
    try {
      if (replace) history.replaceState(null, "", url); else history.pushState(null, "", url);
    } catch (e) { /* a sandboxed frame: the state lives in S alone */ }
  }
  function set(changes, keepPage) {
    typing = false;
    Object.keys(changes).forEach(function (k) { S[k] = String(changes[k]); });
    if (!keepPage) S.page = "1";
    writeHash(false);
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
    no_search: function (e) { return e.ns === 0; },
    repeated: function (e) { return e.rq > 0; },
    bad: function (e) { return !!e.bad; }
  };
  var OUTCOME_LABELS = { all: "all", right: "right (EM 1)", wrong: "wrong", format_failed: "format failed",
    reach_missed: "answer in reach but missed", no_search: "no search", repeated: "repeated a query",
    bad: "bad values (NaN, broken text)" };
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
      var f = flip(en);
      if (S.flip === "flipped" ? !(f === "gained" || f === "lost") : f !== S.flip) return false;
    }
    if (KIND === "run") {
      if (S.step && String(en.a.step) !== S.step) return false;
      if (S.gt === "gt" && !en.a.gt) return false;
      if (S.gt === "policy" && en.a.gt) return false;
      if (S.group && en.a.uid !== S.group) return false;
    }
    if (S.q) {
      var q = S.q.toLowerCase();
      if (![en.a, en.b].some(function (e) { return e && hay(e).indexOf(q) >= 0; })) return false;
    }
    return true;
  }

  // ---- sorting: a column's key, "-" first for descending ----
  var SORTS = {
    em: function (en) { return en.a ? en.a.em : null; },
    f1: function (en) { return en.a ? en.a.f1 : null; },
    cem: function (en) { return en.a ? en.a.cem : null; },
    ns: function (en) { return en.a ? en.a.ns : null; },
    r: function (en) { return en.a ? en.a.r : null; },
    adv: function (en) { return en.a ? en.a.adv : null; },
    step: function (en) { return en.a ? en.a.step : null; },
    gr: function (en) { var e = en.a || en.b; return e.gr ? e.gr[0] * 100 + e.gr[1] : null; },
    d: function (en) { return en.a && en.b ? en.b[BY[S.by] ? S.by : "em"] - en.a[BY[S.by] ? S.by : "em"] : null; }
  };
  function sorted(list) {
    var desc = S.sort.charAt(0) === "-", key = SORTS[S.sort.replace(/^-/, "")];
    if (!key) return list;
    return list.map(function (en, i) { return [key(en), i, en]; }).sort(function (x, y) {
      if (x[0] == null || y[0] == null) return x[0] == null ? (y[0] == null ? x[1] - y[1] : 1) : -1;  // unknowns last
      return (x[0] - y[0]) * (desc ? -1 : 1) || x[1] - y[1];
    }).map(function (x) { return x[2]; });
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
  // a run's summary: the kept episodes of the chosen step (all steps by default), policy samples
  // and injected GT rows apart (a GT row is right by construction: counted in, it lifts EM), as the
  // "rows" filter asks; then EM over every row the step(s) sampled, not only the kept ones
  function runSummaryRows() {
    var kept = EPS[0].filter(function (e) { return !S.step || String(e.step) === S.step; });
    var where = S.step ? " of step " + S.step : "";
    var rows = [];
    if (S.gt !== "gt") rows.push(["policy samples" + where, stats(kept.filter(function (e) { return !e.gt; }))]);
    if (S.gt !== "policy") {
      var gts = kept.filter(function (e) { return e.gt; });
      if (gts.length || S.gt === "gt") rows.push(["GT rows (injected)" + where, stats(gts)]);
    }
    return rows;
  }
  function allRowsLine() {
    var pol = [], gt = [];
    D.run.steps.forEach(function (s) {
      if (S.step && String(s.step) !== S.step) return;
      s.rows.forEach(function (r) { if (r[4] != null) (r[3] ? gt : pol).push(r[4]); });
    });
    if (!pol.length && !gt.length) return "";
    var parts = [];
    if (S.gt !== "gt" && pol.length) parts.push("EM " + fmt(mean(pol)) + " over all " + pol.length + " policy rows");
    if (S.gt !== "policy" && gt.length) parts.push("EM " + fmt(mean(gt)) + " over " + gt.length + " GT rows");
    return parts.length ? "<div class='legend' id='allrows'>Every row the step" + (S.step ? " " + esc(S.step) : "s") +
      " sampled (kept or not): " + parts.join(", ") + "</div>" : "";
  }
  // B minus A over the questions both answered, with its paired standard error
  function paired(by) {
    var d = ENTRIES.filter(function (en) { return en.a && en.b; }).map(function (en) { return en.b[by] - en.a[by]; });
    if (!d.length) return "";
    var m = mean(d);
    var v = d.length > 1 ? d.reduce(function (x, y) { return x + (y - m) * (y - m); }, 0) / (d.length - 1) : 0;
    return BY[by] + " B − A over " + d.length + " questions: " + signed(m) + " (paired s.e. " + fmt(Math.sqrt(v / d.length)) + ")";
  }
  // over the questions both answered: at which model turn the two episodes part
  var PARTS = null;
  function partsLine() {
    if (!PARTS) {
      PARTS = {};
      ENTRIES.forEach(function (en) {
        if (!en.a || !en.b) return;
        var k = divergence(en.a, en.b), at = k < 0 ? "never" : Math.min(4, en.a.turns.slice(0, k).filter(function (t) { return t.t === "m"; }).length + 1);
        PARTS[at] = (PARTS[at] || 0) + 1;
      });
    }
    var keys = [1, 2, 3, 4].filter(function (k) { return PARTS[k]; });
    if (!keys.length && !PARTS.never) return "";
    return "<div class='legend' id='parts'>Where the two episodes of a question part: " + keys.map(function (k) {
      return (k === 4 ? "model turn 4 or later " : "model turn " + k + " ") + PARTS[k];
    }).concat(PARTS.never ? ["never (the same episode) " + PARTS.never] : []).join(", ") + "</div>";
  }
  function renderSummary() {
    var rows = [];
    if (KIND === "run") rows = runSummaryRows();
    else D.sources.forEach(function (src, i) { rows = rows.concat(summaryRows((KIND === "compare" ? "AB"[i] + ": " : "") + src.label, EPS[i])); });
    var h = "<table class='summary' id='summary-table'><tr><th>" + (KIND === "run" ? "kept episodes" : "episodes") +
      "</th><th class='num'>N</th><th class='num'>EM</th><th class='num'>F1</th><th class='num'>cover-EM</th>" +
      "<th class='num'>format</th><th class='num'>answer in reach</th><th class='num'>in reach, missed</th><th class='num'>searches</th></tr>";
    rows.forEach(function (r) {
      var s = r[1];
      h += "<tr><td>" + esc(r[0]) + "</td><td class='num'>" + s.n + "</td><td class='num'>" + (s.n ? fmt(s.em) : "–") +
        "</td><td class='num'>" + (s.n ? fmt(s.f1) : "–") + "</td><td class='num'>" + (s.n ? fmt(s.cem) : "–") + "</td><td class='num'>" +
        (s.fmtN ? fmt(s.fmt / s.fmtN) : "–") + "</td><td class='num'>" + (s.n ? fmt(s.reach / s.n) : "–") +
        "</td><td class='num'>" + s.missed + "</td><td class='num'>" + (s.n ? fmt(s.ns, 2) : "–") + "</td></tr>";
    });
    h += "</table>";
    if (KIND === "run") h += allRowsLine();
    if (KIND === "compare") {
      var by = BY[S.by] ? S.by : "em";
      var c = { gained: 0, lost: 0, both: 0, neither: 0, only_a: 0, only_b: 0 };
      ENTRIES.forEach(function (en) { c[flip(en)]++; });
      var cont = by === "f1";
      var flipLabels = [["all", "all " + ENTRIES.length], ["flipped", (cont ? "changed " : "flipped ") + (c.gained + c.lost)],
        ["gained", (cont ? "B higher " : "B right, A wrong ") + c.gained], ["lost", (cont ? "A higher " : "A right, B wrong ") + c.lost],
        ["both", (cont ? "equal, above 0 " : "both right ") + c.both], ["neither", (cont ? "both 0 " : "both wrong ") + c.neither]];
      if (c.only_a) flipLabels.push(["only_a", "only in A " + c.only_a]);
      if (c.only_b) flipLabels.push(["only_b", "only in B " + c.only_b]);
      h += "<div class='flips' id='flips'><label>by <select id='flipby' data-focus='flipby'>" +
        Object.keys(BY).map(function (k) { return "<option value='" + k + "'" + (k === by ? " selected" : "") + ">" + BY[k] + "</option>"; }).join("") +
        "</select></label>" + flipLabels.map(function (f) {
          return "<button data-flip='" + f[0] + "' data-focus='flip-" + f[0] + "' class='" + (S.flip === f[0] ? "on" : "") + "'>" + esc(f[1]) + "</button>";
        }).join("") + "<span class='legend' id='paired'>" + paired(by) + "</span>" +
        (D.paired_by && D.paired_by !== "id" ? "<span class='legend' id='pairedby'>paired by " + esc(D.paired_by) + " (no usable ids)</span>" : "") + "</div>" +
        partsLine();
    }
    D.sources.forEach(function (src, i) {
      if (src.prompt) h += "<details class='prompt'><summary>" + (KIND === "compare" ? "AB"[i] + ": " : "") +
        "the prompt of the first question</summary><pre>" + esc(src.prompt) + "</pre></details>";
    });
    el("summary").innerHTML = h;
    var flips = el("flips");
    if (flips) flips.onclick = function (ev) { var f = ev.target.getAttribute("data-flip"); if (f) set({ flip: f }); };
    var flipby = el("flipby");
    if (flipby) flipby.onchange = function () { set({ by: flipby.value }); };
  }

  // ---- training runs: curves, each step's groups ----
  // an axis fitted to the data (a rate from 0.133 to 0.173 must not look flat on 0-1)
  // (a rate's axis stays within 0 and 1 when its data do)
  function axis(lo, hi) {
    var a = lo, b = hi;
    if (hi - lo < 1e-9) { a -= 0.05; b += 0.05; }
    var pad = (b - a) * 0.1;
    return [lo >= 0 ? Math.max(0, a - pad) : a - pad, hi <= 1 ? Math.min(1, b + pad) : b + pad];
  }
  function chart(title, series, bands, id) {
    var W = 460, H = 170, L = 40, R = 8, T = 8, B = 20;
    var xs = [], ys = [];
    series.forEach(function (s) { s.pts.forEach(function (p) { xs.push(p[0]); ys.push(p[1]); }); });
    (bands || []).forEach(function (b) { xs.push(b[0]); ys.push(b[1] - b[2], b[1] + b[2]); });
    if (!xs.length) return "";
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var yr = axis(Math.min.apply(null, ys), Math.max.apply(null, ys)), y0 = yr[0], y1 = yr[1];
    if (x1 === x0) x1 = x0 + 1;
    function X(v) { return L + (v - x0) / (x1 - x0) * (W - L - R); }
    function Y(v) { return T + (1 - (v - y0) / (y1 - y0)) * (H - T - B); }
    var g = "<line x1='" + L + "' y1='" + Y(y0) + "' x2='" + (W - R) + "' y2='" + Y(y0) + "' stroke='#ccc'/>";
    var digits = y1 - y0 < 0.2 ? 3 : 2;
    [y0, (y0 + y1) / 2, y1].forEach(function (v) { g += "<text x='2' y='" + (Y(v) + 3) + "' class='tick'>" + v.toFixed(digits) + "</text>"; });
    g += "<text x='" + L + "' y='" + (H - 4) + "'>step " + x0 + "</text><text x='" + (W - R - 50) + "' y='" + (H - 4) + "'>step " + x1 + "</text>";
    (bands || []).forEach(function (b) {
      g += "<line x1='" + X(b[0]) + "' x2='" + X(b[0]) + "' y1='" + Y(b[1] - b[2]) + "' y2='" + Y(b[1] + b[2]) + "' stroke='#d97706'/>";
    });
    var legend = "";
    series.forEach(function (s) {
      if (!s.pts.length) return;
      var d = s.pts.map(function (p, i) { return (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join("");
      g += "<path d='" + d + "' fill='none' stroke='" + s.color + "' stroke-width='1.6'/>";
      s.pts.forEach(function (p) {
        g += "<circle class='pt' data-step='" + p[0] + "' cx='" + X(p[0]) + "' cy='" + Y(p[1]) + "' r='" + (s.dots ? 3 : 2) + "' fill='" + s.color +
          "'><title>" + esc(s.name) + " at step " + p[0] + ": " + fmt(p[1]) + " (click: this step's episodes)</title></circle>";
      });
      legend += "<i style='background:" + s.color + "'></i>" + esc(s.name);
    });
    return "<div class='chart' id='" + id + "'><div class='ct'>" + esc(title) + "</div><svg width='" + W + "' height='" + H + "'>" + g +
      "</svg><div class='legend'>" + legend + "</div></div>";
  }
  function renderRun() {
    if (KIND !== "run") return;
    var run = D.run, c = run.curves;
    function pts(k) { return c.filter(function (r) { return r[k] != null; }).map(function (r) { return [r.step, r[k]]; }); }
    var val = run.validation.map(function (p) { return [p.step, p.accuracy, p.accuracy_se || 0]; });
    var h = "<h2>Training curves <span class='legend'>(click a point for its step's episodes)</span></h2><div class='charts'>" +
      chart("the step's rollouts", [{ name: "mean reward", color: "#1a56db", pts: pts("reward") },
        { name: "EM", color: "#137333", pts: pts("acc") }, { name: "format", color: "#9aa3b2", pts: pts("fmt") }], null, "chart-rollouts") +
      chart((val.length ? "validation EM (± s.e.)" : "evaluation EM") + (run.best ? ", best at step " + run.best.step : ""),
        [{ name: "validation EM", color: "#d97706", dots: true, pts: val.length ? val.map(function (p) { return [p[0], p[1]]; }) : pts("val") },
          { name: "evaluation EM", color: "#6b3fa0", dots: true, pts: pts("eval") }], val, "chart-eval") +
      "</div>";
    h += heldOut(run.heldout || []);
    var steps = run.steps;
    if (steps.length) {
      var cur = S.step ? steps.filter(function (s) { return String(s.step) === S.step; })[0] : steps[steps.length - 1];
      h += "<h2>The step's groups and advantages <span class='legend'>(click a group for its episodes)</span></h2><label>step <select id='stepsel' data-focus='stepsel'>" + steps.map(function (s) {
        return "<option value='" + s.step + "'" + (cur && s.step === cur.step ? " selected" : "") + ">" + s.step + "</option>";
      }).join("") + "</select></label> ";
      if (cur) h += groupsTable(cur);
    } else {
      h += "<p class='empty'>No episodes.jsonl in this run (run.keep_episodes: 0, or a run made before it existed).</p>";
    }
    el("run").innerHTML = h;
    var sel = el("stepsel");
    if (sel) sel.onchange = function () { set({ step: sel.value, group: "" }); };
  }
  // the held-out questions' EM before RL and after it (held_out_em.json): which flipped
  function heldOut(qs) {
    if (!qs.length) return "";
    var c = { gained: [], lost: [], both: 0, neither: 0 };
    qs.forEach(function (q) {
      var b = q[2] >= 1, a = q[3] >= 1;
      if (a !== b) c[a ? "gained" : "lost"].push(q); else c[a ? "both" : "neither"]++;
    });
    var flipped = c.gained.concat(c.lost);
    var h = "<h2>Held-out questions, EM before RL and after</h2><div class='legend' id='heldout'>" + qs.length + " questions: " +
      c.gained.length + " gained, " + c.lost.length + " lost, " + c.both + " right in both, " + c.neither + " wrong in both</div>";
    if (flipped.length) {
      h += "<details class='heldout'><summary>the " + flipped.length + " flipped questions</summary><table class='groups' id='heldout-table'>" +
        "<tr><th>question id</th><th>question</th><th>change</th></tr>" + flipped.map(function (q) {
          var gained = q[3] >= 1;
          return "<tr><td>" + esc(q[0]) + "</td><td>" + esc(q[1]) + "</td><td><span class='badge flip-" + (gained ? "gained'>gained" : "lost'>lost") + "</span></td></tr>";
        }).join("") + "</table></details>";
    }
    return h;
  }
  function groupsTable(step) {
    var groups = {}, order = [];
    step.rows.forEach(function (r) { if (!groups[r[0]]) { groups[r[0]] = []; order.push(r[0]); } groups[r[0]].push(r); });
    var questions = {};
    step.kept.forEach(function (i) { questions[EPS[0][i].uid] = EPS[0][i].q; });
    var h = "<table class='groups'><tr><th>group</th><th>question (kept episodes only)</th><th class='num'>mean reward</th><th>rows: reward / advantage</th></tr>";
    order.forEach(function (uid) {
      var rows = groups[uid], pol = rows.filter(function (r) { return !r[3]; });
      var m = mean(pol.map(function (r) { return r[1] || 0; }));
      var kept = questions[uid] != null;
      h += "<tr class='grp" + (kept ? " kept" : "") + (S.group === uid ? " on" : "") + "' data-uid='" + esc(uid) + "' data-step='" + step.step + "'" +
        (kept ? " tabindex='0' data-focus='grp-" + esc(uid) + "'" : "") + "><td>" + esc(uid) + "</td><td>" + esc(questions[uid] || "") +
        "</td><td class='num'>" + fmt(m) + "</td><td>" +
        rows.map(function (r) {
          return "<span class='chip" + (r[1] >= 1 ? " r1" : "") + (r[3] ? " gt" : "") + "'>" + (r[3] ? "GT " : "") + fmt(r[1], 2) + " / " + signed(r[2]) + "</span>";
        }).join("") + "</td></tr>";
    });
    return h + "</table>";
  }

  // ---- the filter bar: built once, its controls kept (and focused) while the view changes ----
  function options(values, cur, labels) {
    return values.map(function (v) {
      return "<option value='" + esc(v) + "'" + (String(v) === cur ? " selected" : "") + ">" + esc(labels ? labels[v] || v : v) + "</option>";
    }).join("");
  }
  function buildFilters() {
    var all = [].concat(EPS[0], EPS[1] || []);
    var dss = Array.from(new Set(all.map(function (e) { return e.ds; }))).sort();
    var outcomes = Object.keys(OUTCOMES).filter(function (k) { return k !== "bad" || all.some(function (e) { return e.bad; }); });
    var h = "<label>outcome <select data-k='outcome'>" + options(outcomes, S.outcome, OUTCOME_LABELS) + "</select></label>";
    if (KIND === "compare") h += "<label>of <select data-k='side'>" + options(["either", "a", "b", "both"], S.side, { either: "A or B", a: "A", b: "B", both: "A and B" }) + "</select></label>";
    if (dss.length > 1) h += "<label>dataset <select data-k='ds'><option value=''>all</option>" + options(dss, S.ds) + "</select></label>";
    h += "<label>searches <select data-k='ns'><option value=''>any</option>" + options(["0", "1", "2", "3", "4", "5"], S.ns, { 5: "5+" }) + "</select></label>";
    if (KIND === "run") {
      var steps = Array.from(new Set(EPS[0].map(function (e) { return e.step; }))).sort(function (a, b) { return a - b; });
      h += "<label>step <select data-k='step'><option value=''>all</option>" + options(steps, S.step) + "</select></label>";
      h += "<label>rows <select data-k='gt'>" + options(["all", "policy", "gt"], S.gt, { all: "all", policy: "policy samples", gt: "GT (injected)" }) + "</select></label>";
      h += "<span id='groupf'></span>";
    }
    h += "<label>find <input type='search' id='find' placeholder='text in question, answers, turns, passages' value='" + esc(S.q) + "'></label>";
    h += "<span id='count'></span>";
    el("filters").innerHTML = h;
    Array.prototype.forEach.call(el("filters").querySelectorAll("select"), function (s) {
      s.onchange = function () { var c = {}; c[s.getAttribute("data-k")] = s.value; set(c); };
    });
    var timer = null, find = el("find");
    find.oninput = function () {
      clearTimeout(timer);
      timer = setTimeout(function () {
        S.q = find.value; S.page = "1";
        writeHash(typing); typing = true;
        renderList();
      }, 150);
    };
  }
  function syncFilters() {
    Array.prototype.forEach.call(el("filters").querySelectorAll("select"), function (s) {
      var v = S[s.getAttribute("data-k")];
      if (s.value !== v) s.value = v;
    });
    var find = el("find");
    if (find.value !== S.q) find.value = S.q;
    var g = el("groupf");
    if (g) g.innerHTML = S.group ? "<button id='groupclear' data-focus='groupclear'>group " + esc(S.group) + " ✕</button>" : "";
    var gc = el("groupclear");
    if (gc) gc.onclick = function () { set({ group: "" }); };
  }
  // the table's column headings stick just below the filter bar, which sticks to the top
  function fitSticky() {
    document.documentElement.style.setProperty("--filters-h", el("filters").offsetHeight + "px");
  }

  // ---- the list ----
  function emBadge(e) {
    if (!e) return "<span class='badge unk'>absent</span>";
    return "<span class='badge " + (right(e) ? "ok'>EM 1" : "bad'>EM 0") + "</span>";
  }
  function fmtBadge(e) {
    return e.fmt == null ? "<span class='badge unk'>format ?</span>" : e.fmt ? "" : "<span class='badge bad'>format failed</span>";
  }
  function badBadge(e) {
    return e && e.bad ? " <span class='badge bad badval' title='" + esc(e.bad.join("; ")) + "'>bad value</span>" : "";
  }
  var FLIP_LABELS = { gained: "B gained", lost: "B lost", both: "both right", neither: "both wrong", only_a: "only in A", only_b: "only in B" };
  var FLIP_LABELS_F1 = { gained: "B higher", lost: "A higher", both: "equal", neither: "both 0", only_a: "only in A", only_b: "only in B" };
  function th(label, key, cls) {
    var on = S.sort.replace(/^-/, "") === key, desc = S.sort.charAt(0) === "-";
    return "<th" + (cls ? " class='" + cls + "'" : "") + (on ? " aria-sort='" + (desc ? "descending" : "ascending") + "'" : "") +
      "><button class='sort' data-sort='" + key + "' data-focus='sort-" + key + "' title='sort by " + esc(label) + "'>" + esc(label) +
      (on ? (desc ? " ▼" : " ▲") : "") + "</button></th>";
  }
  function header() {
    if (KIND === "compare") return "<thead><tr><th>#</th><th>dataset</th><th>question</th><th>gold</th><th>A: " + esc(D.sources[0].label) +
      "</th><th>B: " + esc(D.sources[1].label) + "</th>" + th("change (" + BY[BY[S.by] ? S.by : "em"] + " B − A)", "d") + "</tr></thead>";
    var h = "<thead><tr><th>#</th>" + (KIND === "run" ? th("step", "step", "num") : "<th>dataset</th>") +
      "<th>question</th><th>gold</th><th>prediction</th>" + th("EM", "em", "num") + th("F1", "f1", "num") + th("cover-EM", "cem", "num");
    if (KIND === "run") h += th("reward", "r", "num") + th("advantage", "adv", "num");
    return h + th("searches", "ns", "num") + th("first gold", "gr", "num") + "<th>end</th><th></th></tr></thead>";
  }
  function goldRank(e) { return e.gr ? "s" + e.gr[0] + (e.gr[1] ? " #" + e.gr[1] : "") : "–"; }
  function row(en, i) {
    var e = en.a, cls = "ep-row" + (S.open === en.key ? " open" : "");
    var attrs = " tabindex='0' data-key='" + esc(en.key) + "' data-focus='row-" + esc(en.key) + "' aria-expanded='" + (S.open === en.key) + "'";
    var base = e || en.b;
    if (KIND === "compare") {
      var f = flip(en), labels = S.by === "f1" ? FLIP_LABELS_F1 : FLIP_LABELS;
      return "<tr class='" + cls + "'" + attrs + " data-flip='" + f + "'><td class='num'>" + (i + 1) + "</td><td>" + esc(base.ds) + "</td><td class='q'>" + esc(base.q) +
        "</td><td class='gold-list'>" + esc(base.gold.join(" | ")) + "</td><td class='pred'>" + emBadge(en.a) + " " + esc(en.a ? en.a.pred : "") + badBadge(en.a) +
        "</td><td class='pred'>" + emBadge(en.b) + " " + esc(en.b ? en.b.pred : "") + badBadge(en.b) + "</td><td><span class='badge flip-" + f + "'>" +
        labels[f] + "</span></td></tr>";
    }
    var h = "<tr class='" + cls + "'" + attrs + " data-em='" + e.em + "'><td class='num'>" + (i + 1) + "</td>" +
      (KIND === "run" ? "<td class='num'>" + e.step + "</td>" : "<td>" + esc(e.ds) + "</td>") +
      "<td class='q'>" + (e.gt ? "<span class='badge gtb'>GT</span> " : "") + esc(e.q) + "</td><td class='gold-list'>" + esc(e.gold.join(" | ")) +
      "</td><td class='pred'>" + esc(e.pred) + "</td><td class='num'>" + emBadge(e) + "</td><td class='num'>" + fmt(e.f1, 2) +
      "</td><td class='num'>" + fmt(e.cem, 0) + "</td>";
    if (KIND === "run") h += "<td class='num'>" + fmt(e.r) + "</td><td class='num'>" + signed(e.adv) + "</td>";
    return h + "<td class='num'>" + e.ns + (e.rq ? " <span class='badge rep' title='searches repeating an earlier query'>" + e.rq + " rep</span>" : "") +
      "</td><td class='num'>" + goldRank(e) + "</td><td>" + esc(e.stop) + "</td><td>" + fmtBadge(e) +
      (e.reach ? " <span class='badge goldb' title='a search returned a passage holding a golden answer'>in reach</span>" : "") + badBadge(e) + "</td></tr>";
  }
  var SHOWN = [];  // the filtered, sorted entries, for the keys that move between pages
  function renderList() {
    var shown = SHOWN = sorted(ENTRIES.filter(matches));
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
    var cols = KIND === "compare" ? 7 : KIND === "run" ? 14 : 12;
    var h = pager(true) + "<table id='episodes'>" + header() + "<tbody>";
    slice.forEach(function (en, k) {
      h += row(en, (page - 1) * PAGE + k);
      if (S.open === en.key) h += "<tr class='detail-row'><td class='detail' colspan='" + cols + "'>" + detail(en) + "</td></tr>";
    });
    h += "</tbody></table>";
    if (!slice.length) h += "<div class='empty'>No " + unit + " match these filters.</div>";
    el("list").innerHTML = h + (shown.length > PAGE ? pager(false) : "");
    el("list").setAttribute("data-page", String(page));
  }

  // ---- one episode ----
  // a find's matches marked in escaped text (the term is matched in the raw text, then escaped)
  function findMarks(text) {
    var q = S.q ? S.q.toLowerCase() : "";
    if (!q) return esc(text);
    var lower = text.toLowerCase(), out = "", at = 0;
    for (var i = lower.indexOf(q); i >= 0; i = lower.indexOf(q, i + q.length)) {
      out += esc(text.slice(at, i)) + "<mark class='find'>" + esc(text.slice(i, i + q.length)) + "</mark>";
      at = i + q.length;
    }
    return out + esc(text.slice(at));
  }
  var TAG = /<(\/?)(think|search|answer|information|result)>/g;
  function markup(text, e) {
    var out = "", at = 0, open = [], m;
    TAG.lastIndex = 0;
    while ((m = TAG.exec(text)) !== null) {
      out += findMarks(text.slice(at, m.index));
      if (!m[1]) {
        out += "<span class='tag'>&lt;" + m[2] + "&gt;</span><span class='blk-" + m[2] + (m[2] === "answer" ? (right(e) ? " ans-ok" : " ans-bad") : "") + "'>";
        open.push(m[2]);
      } else if (open.length && open[open.length - 1] === m[2]) { out += "</span><span class='tag'>&lt;/" + m[2] + "&gt;</span>"; open.pop(); }
      else out += "<span class='tag'>&lt;/" + m[2] + "&gt;</span>";
      at = TAG.lastIndex;
    }
    out += findMarks(text.slice(at));
    open.forEach(function () { out += "</span>"; });
    return out;
  }
  function highlight(text, golds) {
    var lower = text.toLowerCase(), marks = [];
    golds.forEach(function (g) {
      g = String(g).trim().toLowerCase();
      if (g.length < 2 || /^(yes|no|true|false)$/.test(g)) return;
      for (var i = lower.indexOf(g); i >= 0; i = lower.indexOf(g, i + g.length)) marks.push([i, i + g.length, ""]);
    });
    var q = S.q ? S.q.toLowerCase() : "";
    if (q) for (var j = lower.indexOf(q); j >= 0; j = lower.indexOf(q, j + q.length)) marks.push([j, j + q.length, " class='find'"]);
    if (!marks.length) return esc(text);
    marks.sort(function (a, b) { return a[0] - b[0]; });
    var out = "", at = 0;
    marks.forEach(function (m) { if (m[0] >= at) { out += esc(text.slice(at, m[0])) + "<mark" + m[2] + ">" + esc(text.slice(m[0], m[1])) + "</mark>"; at = m[1]; } });
    return out + esc(text.slice(at));
  }
  // a model turn as its tokens (re-tokenized by the run's tokenizer): each a span, shaded by the
  // row's advantage (the trainer logs one per row: a token-level estimator's is their mean)
  function tokens(t, e, from) {
    var out = "", at = 0, a = e.adv || 0, tint = Math.min(1, Math.abs(a)) * 0.45;
    var bg = a > 0 ? "rgba(19,115,51," + tint.toFixed(2) + ")" : a < 0 ? "rgba(179,38,30," + tint.toFixed(2) + ")" : "transparent";
    t.tl.forEach(function (n, i) {
      out += "<span class='tk tk" + (i % 2) + "' style='background:" + bg + "' title='model token " + (from + i + 1) + " · advantage " +
        signed(e.adv) + "'>" + esc(t.x.slice(at, at + n)) + "</span>";
      at += n;
    });
    return out + esc(t.x.slice(at));
  }
  function tokenCounts(e) {
    var m = 0, env = 0, has = false;
    e.turns.forEach(function (t) { if (t.tn != null) { has = true; if (t.t === "m") m += t.tn; else env += t.tn; } });
    return has ? [m, env] : null;
  }
  function episode(e, title, diverge) {
    if (!e) return "<div class='episode'><h3>" + esc(title) + "</h3><p class='empty'>not in this folder</p></div>";
    var f = ["EM " + fmt(e.em, 0), "F1 " + fmt(e.f1, 2), "cover-EM " + fmt(e.cem, 0),
      e.fmt == null ? "format unknown" : e.fmt ? "format ok" : "format failed", "ended: " + (e.stop || "–"),
      e.ns + (e.ns === 1 ? " search" : " searches"), e.nt + (e.nt === 1 ? " turn" : " turns")];
    if (e.tok != null) f.push(e.tok + " tokens");
    f.push(e.reach ? "a golden answer was in reach" : "no golden answer in the passages");
    if (e.gr) f.push("first golden answer: search " + e.gr[0] + (e.gr[1] ? ", rank " + e.gr[1] : ""));
    if (e.rq) f.push(e.rq + (e.rq === 1 ? " search repeats" : " searches repeat") + " an earlier query");
    if (e.r != null) f.push((KIND === "run" ? "reward " : "format-gated reward (pvpo) ") + fmt(e.r));
    if (e.rc) Object.keys(e.rc).forEach(function (k) { f.push(k + " " + fmt(e.rc[k], 2)); });
    if (e.adv != null) f.push("advantage " + signed(e.adv));
    if (e.gt) f.push("GT row (injected)");
    var tc = tokenCounts(e);
    if (tc) f.push("re-tokenized: " + tc[0] + " model tokens (in the loss), " + tc[1] + " env tokens (masked out)");
    if (e.pi) f.push("pi_gt: log-prob " + fmt(e.pi.logprob, 2) + " over " + e.pi.tokens + " tokens (" + fmt(e.pi.logprob_per_token, 3) + " per token, " + (e.pi.source || "–") + ")");
    var tokView = !!tc && S.tok === "1";
    var h = "<div class='episode' data-key='" + esc(e.k) + "'><h3>" + esc(title) + "</h3>" +
      (tc ? "<button class='toktoggle' id='toktoggle' data-focus='toktoggle'>" + (tokView ? "show the text" : "show the tokens") + "</button>" : "") +
      (e.bad ? "<div class='badvals'>bad values in the file, shown as unknown: " + esc(e.bad.join("; ")) + "</div>" : "") +
      "<div><b>" + findMarks(e.q) + "</b></div><div>gold: <span class='gold-list'>" + esc(e.gold.join(" | ")) + "</span> · answer: <b class='" +
      (right(e) ? "ans-ok" : "ans-bad") + "'>" + esc(e.pred || "–") + "</b></div>" +
      "<div class='facts'>" + f.map(function (x) { return "<span>" + esc(x) + "</span>"; }).join("") + "</div>";
    var n = 0, seen = {}, done = 0;
    e.turns.forEach(function (t, k) {
      var mark = diverge === k ? " diverge' id='diverge-" + (title.charAt(0) === "B" ? "b" : "a") : "";
      if (t.t === "m") {
        n++;
        h += "<div class='turn turn-model" + mark + "'><div class='who'>model, turn " + n + (t.tn != null ? " · " + t.tn + " tokens" : "") +
          (diverge === k ? " · the episodes part here" : "") + "</div><pre" + (tokView ? " class='tokens'>" + tokens(t, e, done) : ">" + markup(t.x, e)) + "</pre></div>";
        done += t.tn || 0;
      } else if (t.t === "o") {
        var qn = t.q != null ? String(t.q).toLowerCase().split(/\s+/).join(" ") : null, rep = qn != null && seen[qn];
        if (qn != null) seen[qn] = true;
        h += "<div class='turn turn-obs" + mark + "'><div class='who'>search results" + (t.q != null ? " for <span class='search-query'>" + esc(t.q) + "</span>" : "") +
          (rep ? " <span class='badge rep'>repeated query</span>" : "") + (t.tn != null ? " · " + t.tn + " env tokens, masked out" : "") +
          (diverge === k ? " · the episodes part here" : "") + "</div>";
        if (!t.p.length) h += "<pre>" + highlight(t.x || "", e.gold) + "</pre>";
        t.p.forEach(function (p) {
          h += "<div class='passage" + (p.gold ? " gold" : "") + "' data-id='" + esc(p.id || "") + "' data-gold='" + (p.gold ? 1 : 0) + "'><div class='ph'>[" + p.n + "] <b>" +
            highlight(p.title, []) + "</b>" + (p.id ? "<span class='pid'>id " + esc(p.id) + "</span>" : "") +
            (p.score != null ? "<span class='score'>score " + fmt(p.score, 3) + "</span>" : "") +
            (p.gold ? " <span class='badge goldb'>golden answer</span>" : "") + "</div><div class='pt'>" + highlight(p.text, e.gold) + "</div></div>";
        });
        h += "</div>";
      } else {
        h += "<div class='turn turn-corr" + mark + "'><div class='who'>env correction" + (diverge === k ? " · the episodes part here" : "") + "</div><pre>" + esc(t.x) + "</pre></div>";
      }
    });
    return h + "</div>";
  }
  // where two policies' episodes of one question part: the first turn whose text (a model turn,
  // a correction) or query (a search result) differs, spaces aside; -1 when they never do
  function turnSig(t) {
    var s = t.t === "o" ? (t.q != null ? t.q : t.x || t.p.map(function (p) { return p.title; }).join("|")) : t.x;
    return t.t + ":" + String(s).split(/\s+/).join(" ").trim();
  }
  function divergence(a, b) {
    var n = Math.min(a.turns.length, b.turns.length);
    for (var k = 0; k < n; k++) if (turnSig(a.turns[k]) !== turnSig(b.turns[k])) return k;
    return a.turns.length === b.turns.length ? -1 : n;
  }
  function diffLine(a, b, k) {
    if (k < 0) return "<div class='divergence' id='divergence'>The two episodes are the same, turn for turn.</div>";
    var models = a.turns.slice(0, k).filter(function (t) { return t.t === "m"; }).length;
    var prev = k > 0 ? a.turns[k - 1].t : "";
    var head = !models ? "They part at once: " : "Same through model turn " + models +
      (prev === "o" ? " and its search results" : prev === "c" ? " and its correction" : "") + "; ";
    var first = a.turns[k] || b.turns[k];
    var where = first.t === "m" ? "at model turn " + (models + 1) + " " : first.t === "o" ? "then the search returned other passages: " : "then ";
    function say(e) {
      var t = e.turns[k];
      if (!t) return "ends";
      if (t.t === "o") return "got " + t.p.map(function (p) { return JSON.stringify(p.title); }).join(", ");
      if (t.t === "c") return "was corrected";
      var m = /<(search|answer)>([\s\S]*?)<\/\1>/.exec(t.x);
      return m ? (m[1] === "search" ? "searches " : "answers ") + JSON.stringify(m[2].trim()) : "writes " + JSON.stringify(t.x.slice(0, 60));
    }
    return "<div class='divergence' id='divergence'>" + esc(head + where + "A " + say(a) + ", B " + say(b)) + ".</div>";
  }
  function detail(en) {
    if (KIND !== "compare") return episode(en.a, "");
    var k = en.a && en.b ? divergence(en.a, en.b) : null;
    return (k != null ? diffLine(en.a, en.b, k) : "") + "<div class='pair'>" + episode(en.a, "A: " + D.sources[0].label, k) +
      episode(en.b, "B: " + D.sources[1].label, k) + "</div>";
  }

  // ---- the page ----
  function renderHeader() {
    var what = { eval: "evaluation", compare: "comparison", run: "training run" }[KIND];
    el("top").innerHTML = "<h1>pvpo view: " + what + "</h1>" + D.sources.map(function (s, i) {
      return "<div class='src'>" + (KIND === "compare" ? "<b>" + "AB"[i] + "</b> " : "") + "<b>" + esc(s.label) + "</b> " + esc(s.path) + "</div>";
    }).join("") + "<div class='src'>written " + esc(D.generated) + "</div>" +
      (D.warnings && D.warnings.length ? "<div class='badvals' id='warnings'>bad values outside the episodes, shown as unknown: " +
        esc(D.warnings.join("; ")) + "</div>" : "");
  }
  // what had the focus, named by its data-focus, gets it back once its part is drawn again
  function render() {
    var active = document.activeElement, focus = active && active.getAttribute ? active.getAttribute("data-focus") : null;
    renderSummary();
    renderRun();
    syncFilters();
    renderList();
    fitSticky();
    if (focus) {
      var again = document.querySelector('[data-focus="' + CSS.escape(focus) + '"]');
      if (again && again !== document.activeElement) again.focus({ preventScroll: true });
    }
  }
  function rows() { return Array.prototype.slice.call(el("list").querySelectorAll("tr.ep-row")); }
  function focusRow(key) {
    var r = rows().filter(function (tr) { return tr.getAttribute("data-key") === key; })[0];
    if (r) { r.focus({ preventScroll: true }); r.scrollIntoView({ block: "nearest" }); }
  }
  function toggle(key) {
    set({ open: S.open === key ? "" : key }, true);
    focusRow(key);
  }
  el("list").addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-page]");
    if (b) { set({ page: b.getAttribute("data-page"), open: "" }, true); window.scrollTo(0, el("filters").offsetTop); return; }
    var s = ev.target.closest("button[data-sort]");
    if (s) {
      var k = s.getAttribute("data-sort");
      set({ sort: S.sort === k ? "-" + k : S.sort === "-" + k ? "" : k });
      return;
    }
    if (ev.target.closest("#toktoggle")) { set({ tok: S.tok === "1" ? "" : "1" }, true); return; }
    if (ev.target.closest(".detail-row")) return;
    var tr = ev.target.closest("tr.ep-row");
    if (tr) toggle(tr.getAttribute("data-key"));
  });
  // keys on the list: Enter (or Space) opens or closes the focused row's episode, the arrows move
  // between rows (across pages at either end), Escape closes the open episode
  el("list").addEventListener("keydown", function (ev) {
    var tr = ev.target.closest && ev.target.closest("tr.ep-row");
    if (!tr) return;
    var key = tr.getAttribute("data-key");
    if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); toggle(key); return; }
    if (ev.key !== "ArrowDown" && ev.key !== "ArrowUp") return;
    ev.preventDefault();
    var at = SHOWN.findIndex(function (en) { return en.key === key; }), to = at + (ev.key === "ArrowDown" ? 1 : -1);
    if (at < 0 || to < 0 || to >= SHOWN.length) return;
    var next = SHOWN[to].key;
    if (!rows().some(function (r) { return r.getAttribute("data-key") === next; })) set({ page: Math.floor(to / PAGE) + 1, open: "" }, true);
    focusRow(next);
  });
  document.addEventListener("keydown", function (ev) {
    if (ev.key !== "Escape" || !S.open) return;
    if (ev.target.tagName === "INPUT" || ev.target.tagName === "SELECT") return;
    var key = S.open;
    set({ open: "" }, true);
    focusRow(key);
  });
  el("run").addEventListener("click", function (ev) {
    var pt = ev.target.closest("circle.pt");
    if (pt) { set({ step: pt.getAttribute("data-step"), group: "" }); el("filters").scrollIntoView(); return; }
    var g = ev.target.closest("tr.grp.kept");
    if (g) set({ step: g.getAttribute("data-step"), group: g.getAttribute("data-uid") });
  });
  el("run").addEventListener("keydown", function (ev) {
    var g = ev.target.closest && ev.target.closest("tr.grp.kept");
    if (g && ev.key === "Enter") set({ step: g.getAttribute("data-step"), group: g.getAttribute("data-uid") });
  });
  function fromUrl() { typing = false; readHash(); render(); }
  window.addEventListener("popstate", fromUrl);
  window.addEventListener("hashchange", fromUrl);
  window.addEventListener("resize", fitSticky);
  readHash();
  renderHeader();
  buildFilters();
  render();
  document.documentElement.setAttribute("data-ready-ms", String(Math.round(performance.now())));
})();
