"""`pvpo view`'s page used as a researcher uses it, in headless Chromium driven over the DevTools
protocol (`viewer_support.Browser`): keys (Enter opens an episode, Escape closes it, the arrows move
through rows and change a filter without losing the focus), clicks (a flip, a sort, a curve's point,
a group), typing in "find", the browser's Back undoing a filter, where the table's headings stand
when scrolled, and hostile text that must stay text in every state the page is driven into.

One browser serves the module (its start is most of a test's time); without Chromium these skip."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest
from test_viewer_page import CASES_A, CASES_B
from viewer_support import Browser, write_eval

from pvpo.viewer.headless import find_chromium
from pvpo.viewer.page import write_page

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium is not installed (apt-get install chromium; `make test` installs it when run as root)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    b = Browser()
    try:
        yield b
    finally:
        b.close()


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("keys")
    write_eval(base / "warm", "toy", CASES_A)
    write_eval(base / "rl", "toy", CASES_B)
    return {
        "eval": write_page([base / "warm"], base / "eval.html"),
        "compare": write_page([base / "warm", base / "rl"], base / "compare.html"),
    }


def _focused(b: Browser) -> str | None:
    return b.eval("document.activeElement && document.activeElement.getAttribute('data-key')")


def _count(b: Browser) -> str:
    return str(b.eval("document.getElementById('count').textContent"))


def test_enter_opens_the_focused_row_escape_closes_it_and_the_arrows_move_between_rows(
    browser: Browser, pages: dict[str, Path]
) -> None:
    b = browser
    b.open(pages["eval"])
    assert b.eval("[].every.call(document.querySelectorAll('tr.ep-row'), function (r) { return r.tabIndex === 0; })")
    b.eval("document.querySelector('tr.ep-row').focus()")
    b.key("ArrowDown")
    b.key("ArrowDown")
    assert _focused(b) == "toy/q3"
    b.key("Enter")
    assert b.eval("location.hash") == "#open=toy%2Fq3" and _focused(b) == "toy/q3"
    assert b.eval("document.querySelector('.detail .episode').getAttribute('data-key')") == "toy/q3"
    b.key("Escape")
    assert b.eval("document.querySelector('.detail')") is None and _focused(b) == "toy/q3"
    b.key("ArrowUp")
    assert _focused(b) == "toy/q2"


def test_a_filter_changed_with_the_arrow_keys_keeps_the_focus_and_back_undoes_it(
    browser: Browser, pages: dict[str, Path]
) -> None:
    b = browser
    b.open(pages["eval"])
    b.eval("window.outcome = document.querySelector('select[data-k=outcome]'); window.outcome.focus()")
    b.key("ArrowDown")  # all -> right
    assert b.eval("location.hash") == "#outcome=right" and _count(b) == "2 of 4 episodes"
    assert b.eval("document.activeElement === window.outcome")  # the same control, not a rebuilt one
    b.key("ArrowDown")  # right -> wrong
    assert b.eval("location.hash") == "#outcome=wrong" and _count(b) == "2 of 4 episodes"
    b.back()
    b.wait("location.hash === '#outcome=right'")
    assert _count(b) == "2 of 4 episodes" and b.eval("window.outcome.value") == "right"
    b.back()
    b.wait("location.hash === ''")
    assert _count(b) == "4 of 4 episodes" and b.eval("window.outcome.value") == "all"


def test_typing_in_find_filters_and_marks_the_matches_in_the_opened_episode(
    browser: Browser, pages: dict[str, Path]
) -> None:
    b = browser
    b.open(pages["eval"])
    b.click("#find")
    b.type("guido")
    b.wait("document.getElementById('count').textContent === '1 of 4 episodes'")
    assert b.eval("document.activeElement.id") == "find"
    b.click("tr.ep-row")
    marks = b.eval(
        "[].map.call(document.querySelectorAll('.detail mark.find'), function (m) { return m.textContent; })"
    )
    assert marks and all(m.lower() == "guido" for m in marks)
    b.back()  # the episode closes; the find stays
    b.wait("document.querySelector('.detail') === null")
    assert b.eval("document.getElementById('find').value") == "guido"


def test_the_filter_bar_never_covers_the_lists_headings_and_the_arrows_cross_pages(
    browser: Browser, tmp_path: Path
) -> None:
    items = [
        {
            "id": f"q{i}",
            "question": f"Question {i}?",
            "golden_answers": ["x"],
            "output": {"final_response": "<answer> x </answer>"},
        }
        for i in range(60)
    ]
    (tmp_path / "many.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    b = browser
    b.open(write_page([tmp_path / "many.jsonl"], tmp_path / "many.html"))
    b.eval("window.scrollTo(0, document.getElementById('episodes').offsetTop + 100)")
    b.wait("window.scrollY > 100")
    geometry = b.eval(
        "(function () { var f = document.getElementById('filters').getBoundingClientRect();"
        " var h = document.querySelector('#episodes th').getBoundingClientRect();"
        " var hit = document.elementFromPoint(h.left + 5, h.top + h.height / 2);"
        " return [f.top, f.bottom, h.top, !!hit.closest('#episodes th')]; })()"
    )
    filters_top, filters_bottom, heading_top, heading_visible = geometry
    assert filters_top == 0 and heading_top >= filters_bottom - 1 and heading_visible, geometry
    # the headings' row, screenshot where it stands stuck below the bar, is the same picture as
    # the row where it rests before any scroll (nothing covers it, nothing of it is cut); its last
    # pixel row is left out: the bottom border falls on a fractional pixel, drawn apart in each place
    row = (
        "(function () { var ths = document.querySelectorAll('#episodes th'), r = ths[0].getBoundingClientRect();"
        " var end = ths[ths.length - 1].getBoundingClientRect().right;"
        " return [r.left, r.top + window.scrollY, end - r.left, Math.floor(r.height) - 1]; })()"
    )
    stuck = b.screenshot(tuple(b.eval(row)))
    b.eval("window.scrollTo(0, 0)")
    b.wait("window.scrollY === 0")
    assert b.screenshot(tuple(b.eval(row))) == stuck
    # the arrows go on to the next page and back at the ends of one
    b.eval("var rows = document.querySelectorAll('tr.ep-row'); rows[rows.length - 1].focus()")
    assert _focused(b) == "many/q49"
    b.key("ArrowDown")
    assert _focused(b) == "many/q50" and b.eval("document.getElementById('page').textContent") == "2"
    b.key("ArrowUp")
    assert _focused(b) == "many/q49" and b.eval("document.getElementById('page').textContent") == "1"


def test_a_comparison_flips_by_f1_sorts_by_the_change_and_says_where_the_episodes_part(
    browser: Browser, pages: dict[str, Path]
) -> None:
    b = browser
    b.open(pages["compare"])
    assert b.eval("document.getElementById('parts').textContent") == (
        "Where the two episodes of a question part: model turn 1 3, model turn 2 1"
    )
    b.click("button[data-flip='lost']")
    assert b.eval("location.hash") == "#flip=lost" and _count(b) == "1 of 4 questions"
    b.eval("document.getElementById('flipby').focus()")
    b.key("ArrowDown")  # EM -> cover-EM
    b.key("ArrowDown")  # cover-EM -> F1
    assert b.eval("location.hash") == "#flip=lost&by=f1" and b.eval("document.activeElement.id") == "flipby"
    assert b.eval("document.getElementById('paired').textContent").startswith("F1 B − A over 4 questions")
    b.click("button[data-flip='all']")
    b.click("button[data-sort='d']")
    order = b.eval(
        "[].map.call(document.querySelectorAll('tr.ep-row'), function (r) { return r.getAttribute('data-key'); })"
    )
    assert order[0] == "toy/q2" and order[-1] == "toy/q1"  # B - A's F1 ascending: q2 lost most, q1 gained
    b.open(pages["compare"], "open=toy/q2")
    assert b.eval("document.getElementById('divergence').textContent") == (
        'They part at once: at model turn 1 A answers "Guido van Rossum", B searches "Python creator".'
    )
    b.open(pages["compare"], "open=toy/q1")
    assert b.eval("document.getElementById('divergence').textContent") == (
        'Same through model turn 1 and its search results; at model turn 2 A answers "Paris", B answers "Berlin".'
    )
    assert b.eval("document.getElementById('diverge-a').classList.contains('diverge')")
    colors = b.eval(
        "[].map.call(document.querySelectorAll('.detail .blk-answer'), function (s) { return s.className; })"
    )
    assert colors == ["blk-answer ans-bad", "blk-answer ans-ok"]  # A's Paris is wrong, B's Berlin right


def test_questions_paired_by_text_each_have_a_row_of_their_own(browser: Browser, tmp_path: Path) -> None:
    def folder(name: str, questions: list[str]) -> Path:
        items = [
            {"question": q, "golden_answers": ["x"], "output": {"final_response": "<answer> x </answer>"}}
            for q in questions
        ]
        (tmp_path / name / "toy").mkdir(parents=True)
        (tmp_path / name / "toy" / "predictions.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
        return tmp_path / name

    page = write_page([folder("a", ["One?", "Two?"]), folder("b", ["Three?", "One?"])], tmp_path / "c.html")
    b = browser
    b.open(page)
    keys = b.eval(
        "[].map.call(document.querySelectorAll('tr.ep-row'), function (r) { return r.getAttribute('data-key'); })"
    )
    assert keys == ["toy/#1", "toy/#2", "B:toy/#1"]  # One? (both), Two? (only A), Three? (only B)
    b.eval("document.querySelectorAll('tr.ep-row')[2].focus()")
    b.key("Enter")
    assert b.eval("document.querySelectorAll('.detail .episode')[1].textContent").startswith("B: bThree?")


def _run(path: Path) -> Path:
    """A run dir: step 1 sampled 3 policy rows of q1 (EM 1, 0, 0) and a GT row, and 2 of q2 (EM 0,
    not kept); step 2 one row of q1. Validation EM from 0.133 to 0.173."""
    path.mkdir()
    (path / "config.yaml").write_text("env:\n  protocol: search_r1\n")
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": 0.3 + 0.1 * s, "accuracy": 0.2 * s}) + "\n" for s in (1, 2))
    )
    (path / "checkpoints").mkdir()
    points = [{"step": 0, "accuracy": 0.133, "accuracy_se": 0.01}, {"step": 2, "accuracy": 0.173, "accuracy_se": 0.01}]
    (path / "checkpoints" / "best.json").write_text(json.dumps({"best": {"step": 2}, "points": points}))

    def ep(uid: str, em: float, gt: bool = False) -> dict:
        answer = "x" if em else "y"
        return {
            "uid": uid,
            "question": f"Question {uid}?",
            "golden_answers": ["x"],
            "response": f"<answer> {answer} </answer>",
            "prediction": answer,
            "reward": em,
            "advantage": em - 0.5,
            "em": em,
            "f1": em,
            "cem": em,
            "format_ok": True,
            "is_gt": gt,
        }

    step1 = [ep("toy/q1", 1.0), ep("toy/q1", 0.0), ep("toy/q1", 0.0), ep("toy/q1", 1.0, gt=True)]
    rows1 = [*step1, ep("toy/q2", 0.0), ep("toy/q2", 0.0)]
    lines = [
        {
            "step": 1,
            "rows": [{k: e[k] for k in ("uid", "reward", "advantage", "is_gt", "em")} for e in rows1],
            "episodes": step1,
        },
        {
            "step": 2,
            "rows": [{"uid": "toy/q1", "reward": 1.0, "advantage": 0.0, "is_gt": False, "em": 1.0}],
            "episodes": [ep("toy/q1", 1.0)],
        },
    ]
    (path / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    held_out = {"questions": ["h/1", "h/2", "h/3"], "em": {"before": [0.0, 1.0, 1.0], "after": [1.0, 0.0, 1.0]}}
    (path / "held_out_em.json").write_text(json.dumps(held_out))
    (path / "held_out.jsonl").write_text(
        json.dumps({"id": "h/1", "question": "Held-out one?", "golden_answers": ["x"]}) + "\n"
    )
    return path


def _summary(b: Browser) -> list[list[str]]:
    return b.eval(
        "[].slice.call(document.querySelectorAll('#summary-table tr'), 1).map(function (r) {"
        " return [].map.call(r.cells, function (c) { return c.textContent; }).slice(0, 3); })"
    )


def test_a_runs_summary_counts_policy_samples_apart_from_gt_rows_and_follows_the_filters(
    browser: Browser, tmp_path: Path
) -> None:
    b = browser
    page = write_page([_run(tmp_path / "run")], tmp_path / "run.html")
    b.open(page)
    assert _summary(b) == [["policy samples", "4", "0.500"], ["GT rows (injected)", "1", "1.000"]]
    assert b.eval("document.getElementById('allrows').textContent") == (
        "Every row the steps sampled (kept or not): EM 0.333 over all 6 policy rows, EM 1.000 over 1 GT rows"
    )
    b.eval("document.querySelector('select[data-k=gt]').focus()")
    b.key("ArrowDown")  # all -> policy samples
    assert b.eval("location.hash") == "#gt=policy" and _summary(b) == [["policy samples", "4", "0.500"]]
    b.eval("document.querySelector('select[data-k=step]').focus()")
    b.key("ArrowDown")  # all steps -> step 1
    assert _summary(b) == [["policy samples of step 1", "3", "0.333"]]
    assert "EM 0.200 over all 5 policy rows" in b.eval("document.getElementById('allrows').textContent")


def test_a_curves_point_and_a_group_open_their_episodes_and_the_eval_axis_fits_its_data(
    browser: Browser, tmp_path: Path
) -> None:
    b = browser
    b.open(write_page([_run(tmp_path / "run")], tmp_path / "run.html"))
    ticks = b.eval(
        "[].map.call(document.querySelectorAll('#chart-eval text.tick'), function (t) { return +t.textContent; })"
    )
    assert 0.1 < min(ticks) < 0.133 and 0.173 < max(ticks) < 0.2, ticks  # not 0 to 1: 0.133 -> 0.173 shows its rise
    b.click("#chart-rollouts circle.pt[data-step='2']")
    assert b.eval("location.hash") == "#step=2" and _count(b) == "1 of 5 episodes"
    b.back()
    b.wait("location.hash === ''")
    b.click("tr.grp.kept[data-uid='toy/q1']")
    assert b.eval("location.hash") == "#step=2&group=toy%2Fq1"  # the groups table shows the last step


def test_a_runs_page_lists_the_held_out_questions_that_flipped(browser: Browser, tmp_path: Path) -> None:
    b = browser
    b.open(write_page([_run(tmp_path / "run")], tmp_path / "run.html"))
    assert b.eval("document.getElementById('heldout').textContent") == (
        "3 questions: 1 gained, 1 lost, 1 right in both, 0 wrong in both"
    )
    rows = b.eval(
        "[].slice.call(document.querySelectorAll('#heldout-table tr'), 1).map(function (r) {"
        " return [].map.call(r.cells, function (c) { return c.textContent; }); })"
    )
    assert rows == [["h/1", "Held-out one?", "gained"], ["h/2", "", "lost"]]


def test_an_episode_with_a_nan_advantage_is_marked_and_its_neighbours_shown(browser: Browser, tmp_path: Path) -> None:
    run = _run(tmp_path / "run")
    lines = (run / "episodes.jsonl").read_text().splitlines()
    rows, kept = lines[0].split('"episodes"')
    lines[0] = rows + '"episodes"' + kept.replace('"advantage": -0.5', '"advantage": NaN', 1)  # step 1's second
    (run / "episodes.jsonl").write_text("\n".join(lines) + "\n")
    b = browser
    b.open(write_page([run], tmp_path / "run.html"))
    assert _count(b) == "5 of 5 episodes"
    marked = b.eval("[].map.call(document.querySelectorAll('tr.ep-row .badval'), function (s) { return s.title; })")
    assert marked == ["advantage is nan (shown as –)"]
    b.eval(
        "document.querySelector('select[data-k=outcome]').value = 'bad';"
        " document.querySelector('select[data-k=outcome]').dispatchEvent(new Event('change'))"
    )
    assert _count(b) == "1 of 5 episodes"
    b.click("tr.ep-row")
    assert b.eval("document.querySelector('.detail .badvals').textContent") == (
        "bad values in the file, shown as unknown: advantage is nan (shown as –)"
    )


def test_a_runs_episode_shows_its_tokens_shaded_by_its_advantage(browser: Browser, tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    run = _run(tmp_path / "run")
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    (run / "initial_policy").mkdir()
    tokenizer.save(str(run / "initial_policy" / "tokenizer.json"))
    b = browser
    b.open(write_page([run], tmp_path / "run.html"), "open=1/0/toy%2Fq1")
    assert "re-tokenized: 7 model tokens (in the loss), 0 env tokens (masked out)" in b.eval(
        "document.querySelector('.detail .facts').textContent"
    )
    b.click("#toktoggle")
    assert (
        b.eval("location.hash") == "#tok=1&open=1%2F0%2Ftoy%2Fq1" and b.eval("document.activeElement.id") == "toktoggle"
    )
    spans = b.eval(
        "[].map.call(document.querySelectorAll('.detail pre.tokens .tk'), function (s) { return s.textContent; })"
    )
    assert spans == ["<", "answer", ">", " x", " </", "answer", ">"]
    assert b.eval("document.querySelector('.detail .tk').title") == "model token 1 · advantage +0.500"
    b.back()
    b.wait("document.querySelectorAll('.detail pre.tokens').length === 0")


HOSTILE = [
    '<img src=x onerror="window.pwned=1">',
    "\"'><svg onload=window.pwned=1>",
    "</script><script>window.pwned=1</script>",
    "' onmouseover='window.pwned=1' x='",
    "<iframe src=javascript:window.pwned=1></iframe>",
]


def _inert(b: Browser) -> list[str]:
    """What the page holds that no text should make: an `on*` attribute, an element that loads or
    runs something, a third script, a `javascript:` link, and the payloads' own flag."""
    return b.eval(
        "(function () { var bad = [];"
        " [].forEach.call(document.querySelectorAll('*'), function (e) {"
        "  [].forEach.call(e.attributes, function (a) { if (/^on/i.test(a.name) || (/^(href|src|action|formaction|xlink:href)$/i.test(a.name) && /javascript:/i.test(a.value))) bad.push(e.tagName + '@' + a.name); });"
        "  if (/^(IMG|IFRAME|OBJECT|EMBED|FRAME)$/.test(e.tagName)) bad.push(e.tagName); });"
        " if (document.scripts.length !== 2) bad.push(document.scripts.length + ' scripts');"
        " if (window.pwned) bad.push('pwned'); return bad; })()"
    )


def test_hostile_text_in_every_field_stays_text_in_every_state_of_the_page(browser: Browser, tmp_path: Path) -> None:
    evil = " ".join(HOSTILE)
    cases = [
        ("q1", evil, [evil], [f"<search> {evil} </search>", f"<answer> {evil} </answer>"]),
        (
            "q2",
            "Who created Python?",
            ["Guido van Rossum"],
            [f"<think> {evil} </think><answer> Guido van Rossum </answer>"],
        ),
    ]
    write_eval(tmp_path / evil.replace("/", "_")[:60], "toy", cases)
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    (folder / "toy" / "run.json").write_text(json.dumps({"label": evil, "dataset": "toy"}))
    other = write_eval(tmp_path / "other", "toy", CASES_A[:1] + [cases[1]]).parent
    b = browser
    eval_page = write_page([folder], tmp_path / "e.html")
    compare_page = write_page([folder, other], tmp_path / "c.html")
    b.open(eval_page)
    assert _inert(b) == [] and b.eval("document.title").startswith("pvpo view: evaluation of <img")
    b.eval("document.querySelector('tr.ep-row').focus()")
    b.key("Enter")
    assert _inert(b) == [] and evil in b.eval("document.querySelector('.detail').textContent")
    b.click("#find")
    b.type("<svg onload")
    b.wait("location.hash.indexOf('q=') >= 0")
    assert _count(b) == "2 of 2 episodes"  # q2's think block holds it too; q1 is still open
    assert _inert(b) == [] and b.eval("document.querySelectorAll('.detail mark.find').length") >= 2
    b.open(compare_page)
    assert _inert(b) == [] and b.eval("document.getElementById('pairedby').textContent").startswith(
        "paired by question text"
    )
    b.click("tr.ep-row[data-flip='both']")
    assert _inert(b) == [] and b.eval("document.getElementById('divergence').textContent")
    run = _run(tmp_path / "run")
    lines = [json.loads(x) for x in (run / "episodes.jsonl").read_text().splitlines()]
    for line in lines:
        for e in line["episodes"] + line["rows"]:
            e["uid"] = "toy/" + evil
            e.setdefault("question", evil)
    (run / "episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (run / "held_out.jsonl").write_text(json.dumps({"id": "h/1", "question": evil}) + "\n")
    run_page = write_page([run], tmp_path / "r.html")
    hostile_state = urlencode(
        {k: HOSTILE[i % len(HOSTILE)] for i, k in enumerate(("step", "group", "q", "sort", "by", "open"))}
    )
    b.open(run_page, hostile_state)  # a link someone sent: the state in its fragment is text too
    assert _inert(b) == [] and HOSTILE[1] in b.eval("document.getElementById('groupf').textContent")
    b.open(run_page)
    b.eval("document.querySelector('details.heldout').open = true")
    assert _inert(b) == []
    b.click("tr.grp.kept")
    b.click("tr.ep-row")
    assert _inert(b) == [] and b.eval("document.querySelectorAll('.detail .episode').length") == 1
