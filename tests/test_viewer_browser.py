"""`pvpo view`'s page as a browser shows it: headless Chromium opens the file (file://, no network),
runs its script, and the test reads the DOM: the episodes, a filter, the comparison's flipped rows,
a training run's groups and GT rows, and 10,000 episodes shown a page at a time.

Chromium comes from Debian (`apt-get install chromium`; `make test` installs it where it runs as
root, as CI does); without it these tests skip, saying so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_trainer_episode_log import CharTokenizer, _traj
from test_viewer_page import CASES_A, CASES_B
from viewer_support import Node, dump_dom, parse_dom, write_eval

from pvpo.envs.data import QAExample
from pvpo.trainer.config.schema import RunConfig
from pvpo.trainer.state.episode_log import log_step_episodes, read_episode_log
from pvpo.viewer.headless import find_chromium
from pvpo.viewer.page import write_page

pytestmark = pytest.mark.skipif(
    find_chromium() is None,
    reason="headless Chromium is not installed (apt-get install chromium; `make test` installs it when run as root)",
)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("view")
    warm, rl = base / "warm", base / "rl"
    write_eval(warm, "toy", CASES_A[:2])
    write_eval(warm, "geo", CASES_A[2:])
    write_eval(rl, "toy", CASES_B[:2])
    write_eval(rl, "geo", CASES_B[2:])
    return {
        "eval": write_page([warm], base / "eval.html"),
        "compare": write_page([warm, rl], base / "compare.html"),
    }


def _rows(dom: Node) -> list[Node]:
    return dom.by_id("episodes").select("tr", "ep-row")


def _open(dom: Node, key: str) -> list[Node]:
    return [n for n in dom.select("div", "episode") if n.attrs.get("data-key") == key]


def test_the_page_lists_every_episode_and_opens_one_with_its_turns_passages_and_gold_mark(
    pages: dict[str, Path],
) -> None:
    dom = parse_dom(dump_dom(pages["eval"], "open=toy/q1"))
    assert sorted(r.attrs["data-key"] for r in _rows(dom)) == ["geo/q3", "geo/q4", "toy/q1", "toy/q2"]
    assert dom.by_id("count").text == "4 of 4 episodes"
    [episode] = _open(dom, "toy/q1")
    assert "What is the capital of Germany?" in episode.text and "Berlin" in episode.text
    model = episode.select("div", "turn-model")
    assert [m.select("pre")[0].text for m in model] == [
        "<search> capital of Germany </search>",
        "<answer> Paris </answer>",
    ]
    assert episode.select("span", "blk-search")[0].text == " capital of Germany "  # the query set apart from its tags
    [results] = episode.select("div", "turn-obs")
    assert results.select("span", "search-query")[0].text == "capital of Germany"
    passages = results.select("div", "passage")
    assert [(p.attrs["data-id"], p.attrs["data-gold"]) for p in passages] == [
        ("doc0", "1"),
        ("doc1", "0"),
        ("doc3", "0"),
    ]
    assert "golden answer" in passages[0].text and passages[0].select("mark")[0].text == "Berlin"
    assert "score 1.000" in passages[0].text
    assert "a golden answer was in reach" in episode.text and "EM 0" in episode.text


def test_a_filter_shows_only_its_episodes(pages: dict[str, Path]) -> None:
    wrong = parse_dom(dump_dom(pages["eval"], "outcome=wrong"))
    assert sorted(r.attrs["data-key"] for r in _rows(wrong)) == ["geo/q4", "toy/q1"]
    assert wrong.by_id("count").text == "2 of 4 episodes"
    missed = parse_dom(dump_dom(pages["eval"], "outcome=reach_missed"))
    assert [r.attrs["data-key"] for r in _rows(missed)] == ["toy/q1"]
    broken = parse_dom(dump_dom(pages["eval"], "outcome=format_failed&ds=geo"))
    assert [r.attrs["data-key"] for r in _rows(broken)] == ["geo/q4"]
    found = parse_dom(dump_dom(pages["eval"], "q=guido"))
    assert [r.attrs["data-key"] for r in _rows(found)] == ["toy/q2"]
    none = parse_dom(dump_dom(pages["eval"], "ns=1&outcome=format_failed"))
    assert _rows(none) == [] and none.by_id("count").text == "0 of 4 episodes"


def test_the_comparison_shows_the_flipped_questions_with_both_episodes_side_by_side(pages: dict[str, Path]) -> None:
    dom = parse_dom(dump_dom(pages["compare"]))
    assert {r.attrs["data-key"]: r.attrs["data-flip"] for r in _rows(dom)} == {
        "toy/q1": "gained",
        "toy/q2": "lost",
        "geo/q3": "both",
        "geo/q4": "neither",
    }
    flipped = parse_dom(dump_dom(pages["compare"], "flip=flipped&open=toy/q1"))
    assert [(r.attrs["data-key"], r.attrs["data-flip"]) for r in _rows(flipped)] == [
        ("toy/q1", "gained"),
        ("toy/q2", "lost"),
    ]
    assert flipped.by_id("count").text == "2 of 4 questions"
    [pair] = flipped.select("div", "pair")
    a, b = pair.select("div", "episode")
    assert a.select("h3")[0].text == "A: warm" and "Paris" in a.text
    assert b.select("h3")[0].text == "B: rl" and "<answer> Berlin </answer>" in b.text
    assert [p.attrs["data-gold"] for p in b.select("div", "passage")] == ["1", "0", "0"]
    gained = parse_dom(dump_dom(pages["compare"], "flip=gained"))
    assert [r.attrs["data-key"] for r in _rows(gained)] == ["toy/q1"]


def test_a_training_runs_page_shows_the_curves_each_steps_groups_and_its_gt_rows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("env:\n  protocol: search_r1\n")
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": 0.2 * s, "accuracy": 0.1 * s}) + "\n" for s in (1, 2, 3))
    )
    points = [
        {"step": 0, "accuracy": 0.2, "accuracy_se": 0.05, "n": 40},
        {"step": 2, "accuracy": 0.3, "accuracy_se": 0.05, "n": 40},
    ]
    (run / "checkpoints" / "best.json").write_text(json.dumps({"best": {"step": 2, "accuracy": 0.3}, "points": points}))
    trajs = [_traj("toy/q1", 1.0), _traj("toy/q1", 0.0), _traj("toy/q1", 1.0, gt=True), _traj("toy/q2", 0.0)]
    for step in (1, 2, 3):
        log_step_episodes(
            run / "episodes.jsonl",
            step,
            trajs,
            torch.tensor([0.25, -0.75, 0.25, 0.0]),
            torch.ones(4, 40),
            [QAExample("toy/q1", "First question?", ("x",)), QAExample("toy/q2", "Second?", ("x",))],
            CharTokenizer(),
            RunConfig(keep_episodes=8),
        )
    page = write_page([run], tmp_path / "run.html")
    # an episode's key is step/position among the step's kept episodes/uid
    gt_keys = [
        f"{s['step']}/{k}/{e['uid']}"
        for s in read_episode_log(run / "episodes.jsonl")
        for k, e in enumerate(s["episodes"])
        if e["is_gt"]
    ]
    gt_key = gt_keys[1]
    dom = parse_dom(dump_dom(page, f"step=2&open={gt_key}"))
    assert len(dom.select("svg")) == 2 and "best at step 2" in dom.by_id("run").text
    groups = dom.by_id("run").select("table", "groups")[0]
    chips = [c.text for c in groups.select("span", "chip")]
    assert chips == ["1.00 / +0.250", "0.00 / -0.750", "GT 1.00 / +0.250", "0.00 / +0.000"]
    assert "First question?" in groups.text
    rows = _rows(dom)
    assert len(rows) == 4 and dom.by_id("count").text == "4 of 12 episodes"  # the step filter
    assert sum("GT" in r.text for r in rows) == 1
    [episode] = _open(dom, gt_key)
    assert "GT row (injected)" in episode.text and "pi_gt: log-prob" in episode.text and "reference" in episode.text
    gt_only = parse_dom(dump_dom(page, "gt=gt"))
    assert [r.attrs["data-key"] for r in _rows(gt_only)] == gt_keys and len(gt_keys) == 3


def test_ten_thousand_episodes_open_one_page_of_rows_at_a_time(tmp_path: Path) -> None:
    passages = "\n".join(f"Doc {i}(Title: Title {i}) " + "words of a passage " * 25 for i in (1, 2, 3))
    response = (
        "<think>"
        + "reasoning " * 40
        + "</think>\n<search> a query </search>\n\n<information>"
        + passages
        + "</information>\n\n<answer> x </answer>"
    )
    items = [
        {
            "id": f"test_{i}",
            "question": f"Question number {i}?",
            "golden_answers": ["x" if i % 2 else "y"],
            "output": {
                "final_response": response,
                "pred": "x",
                "metric_score": {"em": float(i % 2), "f1": 0.0, "acc": 0.0},
            },
        }
        for i in range(10_000)
    ]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(it) + "\n" for it in items))
    page = write_page([path], tmp_path / "big.html")
    dom = parse_dom(dump_dom(page))
    assert dom.by_id("count").text == "10000 of 10000 episodes" and dom.by_id("page").text == "1"
    assert len(_rows(dom)) == 50 and dom.select("div", "episode") == []  # turns render only when opened
    last = parse_dom(dump_dom(page, "outcome=right&page=100"))
    assert last.by_id("count").text == "5000 of 10000 episodes" and _rows(last)[-1].attrs["data-key"] == "big/test_9999"
