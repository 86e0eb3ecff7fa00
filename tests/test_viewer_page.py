"""`pvpo view` without a browser: responses cut into turns with their passages and golden-answer
marks, the folders it reads (evaluation, FlashRAG file, run dir), the pairing of two evaluations,
the page's data block, the command's errors and `--serve`."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner
from viewer_support import CORPUS, write_eval

from pvpo.cli import app
from pvpo.reward import RESEARCH, SEARCH_R1
from pvpo.trainer.state.episode_log import read_episode_log
from pvpo.viewer.compare import pair_episodes
from pvpo.viewer.episodes import (
    detect_protocol,
    first_gold,
    holds_gold,
    page_episode,
    repeated_queries,
    split_passages,
    split_turns,
    usable_golds,
)
from pvpo.viewer.page import build_page, embed_json, page_data
from pvpo.viewer.serve import PageServer
from pvpo.viewer.sources import ViewError, read_source
from tests.conftest import shared_data

runner = CliRunner()

CASES_A = [
    (
        "q1",
        "What is the capital of Germany?",
        ["Berlin"],
        ["<search> capital of Germany </search>", "<answer> Paris </answer>"],
    ),
    ("q2", "Who created Python?", ["Guido van Rossum"], ["<answer> Guido van Rossum </answer>"]),
    (
        "q3",
        "What is the capital of Japan?",
        ["Tokyo"],
        ["<search> capital Japan </search>", "<answer> Tokyo </answer>"],
    ),
    ("q4", "What is the highest mountain?", ["Mount Everest"], ["I think K2", "<think> maybe K2<answer> K2 </answer>"]),
]
CASES_B = [
    (
        "q1",
        "What is the capital of Germany?",
        ["Berlin"],
        ["<search> capital of Germany </search>", "<answer> Berlin </answer>"],
    ),
    (
        "q2",
        "Who created Python?",
        ["Guido van Rossum"],
        ["<search> Python creator </search>", "<answer> Larry </answer>"],
    ),
    ("q3", "What is the capital of Japan?", ["Tokyo"], ["<answer> Tokyo </answer>"]),
    ("q4", "What is the highest mountain?", ["Mount Everest"], ["<answer> K2 </answer>"]),
]


@pytest.fixture
def evals(tmp_path: Path) -> tuple[Path, Path]:
    a, b = tmp_path / "warm", tmp_path / "rl"
    write_eval(a, "toy", CASES_A)
    write_eval(b, "toy", CASES_B)
    return a, b


# ---- turns and passages ---------------------------------------------------------------------------
def test_a_response_splits_into_model_turns_search_results_with_ids_and_scores_and_corrections(
    evals: tuple[Path, Path],
) -> None:
    items = [json.loads(x) for x in (evals[0] / "toy" / "predictions.jsonl").read_text().splitlines()]
    q1, q4 = items[0]["output"], items[3]["output"]
    assert [[p["id"] for p in found] for found in q1["passages"]] == [["doc0", "doc1", "doc3"]]  # eval records them
    turns = split_turns(q1["final_response"], SEARCH_R1, q1["passages"], usable_golds(["Berlin"]))
    assert [t["t"] for t in turns] == ["m", "o", "m"]
    assert turns[0]["x"] == "<search> capital of Germany </search>" and turns[2]["x"] == "<answer> Paris </answer>"
    berlin = turns[1]["p"][0]
    assert (berlin["n"], berlin["title"], berlin["id"], berlin["gold"]) == (1, "Berlin", "doc0", True)
    assert berlin["text"] == CORPUS[0][1] and berlin["score"] == q1["passages"][0][0]["score"]
    assert [p["gold"] for p in turns[1]["p"]] == [True, False, False]
    corrected = split_turns(q4["final_response"], SEARCH_R1)
    assert [t["t"] for t in corrected] == ["m", "c", "m"] and corrected[1][
        "x"
    ] == SEARCH_R1.correction_message().strip()


def test_a_result_block_the_model_wrote_itself_stays_in_its_text() -> None:
    text = "<think>I recall <information>Doc 1(Title: X) made up</information></think><answer> x </answer>"
    assert split_turns(text, SEARCH_R1) == [{"t": "m", "x": text}]


def test_golden_answers_mark_whole_words_and_never_a_bare_verdict() -> None:
    assert holds_gold("It was released in 1991.", usable_golds(["1991"]))
    assert not holds_gold("It was released in 1991.", usable_golds(["19"]))
    assert holds_gold("The Beatles' song", usable_golds(["the beatles"]))  # normalised: articles, case, punctuation
    assert not holds_gold("Yes, the city is large.", usable_golds(["yes"]))


def test_a_title_holding_parentheses_is_read_to_its_balancing_one() -> None:
    found = split_passages(
        "Doc 1(Title: Python (programming language)) Python is a language.\nDoc 2(Title: Cat) A cat."
    )
    assert [(p["title"], p["text"]) for p in found] == [
        ("Python (programming language)", "Python is a language."),
        ("Cat", "A cat."),
    ]


def test_the_protocol_of_a_response_is_the_one_whose_result_block_it_holds() -> None:
    research = f"<search> q </search>{RESEARCH.wrap_observation('Doc 1(Title: T) t')}<answer> \\boxed{{x}} </answer>"
    assert detect_protocol(research).name == "research"
    assert detect_protocol("<answer> x </answer>").name == "search_r1"
    assert [t["t"] for t in split_turns(research, RESEARCH)] == ["m", "o", "m"]


# ---- sources ----------------------------------------------------------------------------------------
def test_an_eval_out_folder_shows_every_datasets_episodes_with_their_outcomes(tmp_path: Path) -> None:
    write_eval(tmp_path / "out", "toy", CASES_A[:2])
    write_eval(tmp_path / "out", "geo", CASES_A[2:])
    src = read_source(tmp_path / "out")
    assert src.kind == "eval" and src.label == "out"
    assert sorted(e["k"] for e in src.episodes) == ["geo/q3", "geo/q4", "toy/q1", "toy/q2"]
    by = {e["k"]: e for e in src.episodes}
    assert (by["toy/q1"]["em"], by["toy/q1"]["reach"], by["toy/q1"]["ns"]) == (0.0, True, 1)  # in reach, missed
    assert (by["toy/q2"]["em"], by["toy/q2"]["reach"], by["toy/q2"]["ns"]) == (1.0, False, 0)
    assert by["geo/q4"]["fmt"] is False and by["geo/q3"]["fmt"] is True
    assert src.prompt.startswith("Answer the given question.")


def test_a_flashrag_file_of_search_r1_runs_reads_with_every_search_result_split() -> None:
    path = shared_data("scored", "bamboogle_search_r1_instruct.json")
    src = read_source(path)
    items = json.loads(path.read_text())
    assert len(src.episodes) == len(items) == 125
    for e, it in zip(src.episodes, items, strict=True):
        blocks = it["output"]["final_response"].count("<information>")
        assert sum(t["t"] == "o" for t in e["turns"]) == blocks
        assert all(len(t["p"]) == 3 for t in e["turns"] if t["t"] == "o")  # Search-R1's top 3, each split out
        assert e["em"] == it["output"]["metric_score"]["em"] and e["fmt"] is None  # not recorded: unknown


def test_two_evaluations_pair_by_question_and_say_which_flipped(evals: tuple[Path, Path]) -> None:
    a, b = (read_source(p) for p in evals)
    pairs = pair_episodes(a.episodes, b.episodes)
    assert [(a.episodes[i]["k"], flip) for i, _, flip in pairs] == [
        ("toy/q1", "gained"),
        ("toy/q2", "lost"),
        ("toy/q3", "both"),
        ("toy/q4", "neither"),
    ]
    fewer = pair_episodes(a.episodes[1:], b.episodes[:3])
    assert [f for _, _, f in fewer] == ["lost", "both", "only_a", "only_b"]


def test_a_comparison_of_folders_with_no_question_in_common_is_refused(
    evals: tuple[Path, Path], tmp_path: Path
) -> None:
    other = write_eval(tmp_path / "other", "geo", CASES_A[:1]).parent
    with pytest.raises(ViewError, match="share no question"):
        page_data([read_source(evals[0]), read_source(other)])


def test_a_run_dirs_page_holds_its_steps_groups_curves_and_validation(tmp_path: Path) -> None:
    import torch
    from test_trainer_episode_log import CharTokenizer, _traj

    from pvpo.envs.data import QAExample
    from pvpo.trainer.config.schema import RunConfig
    from pvpo.trainer.state.episode_log import log_step_episodes

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  protocol: search_r1\n")
    (run / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": 0.1 * s, "accuracy": 0.05 * s}) + "\n" for s in (1, 2))
    )
    (run / "checkpoints").mkdir()
    best = {
        "best": {"step": 2, "accuracy": 0.3},
        "points": [{"step": 0, "accuracy": 0.1, "accuracy_se": 0.02, "n": 50}],
    }
    (run / "checkpoints" / "best.json").write_text(json.dumps(best))
    trajs = [_traj("toy/q1", 1.0), _traj("toy/q1", 0.0), _traj("toy/q1", 1.0, gt=True)]
    for step in (1, 2):
        log_step_episodes(
            run / "episodes.jsonl",
            step,
            trajs,
            torch.tensor([0.5, -0.5, 0.5]),
            torch.ones(3, 40),
            [QAExample("toy/q1", "First?", ("x",))],
            CharTokenizer(),
            RunConfig(keep_episodes=3),
        )
    assert len(read_episode_log(run / "episodes.jsonl")) == 2
    data = page_data([read_source(run)])
    assert data["kind"] == "run"
    assert [s["step"] for s in data["run"]["steps"]] == [1, 2]
    assert data["run"]["steps"][0]["rows"] == [
        ["toy/q1", 1.0, 0.5, False, 1.0],
        ["toy/q1", 0.0, -0.5, False, 0.0],
        ["toy/q1", 1.0, 0.5, True, 1.0],
    ]
    assert data["run"]["validation"] == best["points"] and data["run"]["best"]["step"] == 2
    assert [c["reward"] for c in data["run"]["curves"]] == [0.1, 0.2]
    gt = [e for e in data["episodes"][0] if e["gt"]]
    assert len(gt) == 2 and gt[0]["pi"]["source"] == "reference" and gt[0]["step"] == 1


# ---- the page -----------------------------------------------------------------------------------------
def test_no_text_of_an_episode_can_end_the_pages_data_block(tmp_path: Path) -> None:
    nasty = "</script><script>window.pwned = 1</script><!-- x"
    write_eval(tmp_path / "e", "toy", [("q1", nasty, ["x"], [f"<answer> {nasty} </answer>"])])
    page = build_page([tmp_path / "e"])
    block = re.search(r'<script type="application/json" id="pvpo-data">(.*?)</script>', page, re.S)
    assert block is not None
    data = json.loads(block.group(1))
    assert data["episodes"][0][0]["q"] == nasty and "</script>" not in block.group(1)
    assert json.loads(embed_json({"x": nasty})) == {"x": nasty}
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page  # fetches nothing


def test_view_writes_the_page_and_names_its_file(evals: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "page.html"
    res = runner.invoke(app, ["view", str(evals[0]), str(evals[1]), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"wrote {out}" in res.output and out.is_file() and "file://" in res.output
    assert not (evals[0] / "toy" / "page.html").exists()  # nothing written into what is read


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nothing-here"], "no such file or folder"),
        (["{empty}"], "holds no predictions.jsonl"),
        (["{a}", "{a}", "{a}"], "one folder, or two evaluation folders"),
        (["{run}", "{a}"], "is a training run dir: a comparison takes two evaluation folders"),
    ],
)
def test_view_refuses_what_it_cannot_show_in_one_line(
    args: list[str], message: str, evals: tuple[Path, Path], tmp_path: Path
) -> None:
    (tmp_path / "empty").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run: {}\n")
    (run / "metrics.jsonl").write_text("")
    paths = [a.format(empty=tmp_path / "empty", a=evals[0], run=run) for a in args]
    res = runner.invoke(app, ["view", *paths, "--out", str(tmp_path / "p.html")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert res.output.startswith("error: ") and message in res.output.splitlines()[0] and "Traceback" not in res.output


def test_serve_answers_the_page_on_loopback_only(evals: tuple[Path, Path]) -> None:
    page = build_page([evals[0]])
    server = PageServer(page).start()
    try:
        assert server.url.startswith("http://127.0.0.1:")
        got = httpx.get(server.url, timeout=10)
        assert got.status_code == 200 and got.text == page and got.headers["content-type"].startswith("text/html")
        assert httpx.get(server.url + "etc/passwd", timeout=10).status_code == 404
    finally:
        server.close()


# ---- what an episode adds for a researcher ---------------------------------------------------------------
def _obs(*passages: str) -> str:
    return SEARCH_R1.wrap_observation("\n".join(f"Doc {i}(Title: T{i}) {p}" for i, p in enumerate(passages, 1)))


def test_a_search_result_is_headed_by_the_query_the_env_recorded_else_the_turns_last_search() -> None:
    response = f"<search> first </search>{_obs('a')}<search> a </search> <search> second </search>{_obs('b')}"
    turns = split_turns(response, SEARCH_R1, queries=["first (cut)"])
    assert [t.get("q") for t in turns if t["t"] == "o"] == ["first (cut)", "second"]


def test_an_episode_records_where_the_first_gold_passage_came_and_its_repeated_queries() -> None:
    response = f"<search> Berlin </search>{_obs('no', 'none')}<search>  berlin </search>{_obs('no', 'Berlin it is')}"
    e = page_episode(
        key="k",
        item_id="1",
        dataset="d",
        question="Q?",
        golds=["Berlin"],
        response=response + "<answer> x </answer>",
        prediction="x",
        scores={},
        format_ok=True,
        stop_reason="answer",
        num_searches=None,
        num_turns=None,
    )
    assert e["gr"] == [2, 2] and e["rq"] == 1 and e["ns"] == 2
    assert first_gold([{"t": "o", "p": [{"gold": False}]}]) is None
    assert repeated_queries([{"t": "o", "p": [], "q": "A b"}, {"t": "o", "p": [], "q": "a  B"}]) == 1


def test_an_evaluations_episodes_carry_the_format_gated_reward_training_would_give(evals: tuple[Path, Path]) -> None:
    by = {e["k"]: e for e in read_source(evals[0]).episodes}
    assert by["toy/q2"]["r"] == 1.0  # right, in format
    assert by["toy/q1"]["r"] == pytest.approx(0.1)  # wrong in format: pvpo's floor
    assert by["toy/q4"]["fmt"] is False and by["toy/q4"]["r"] == 0.0  # format broken: gated to 0


def test_the_reward_of_a_response_longer_than_training_makes_is_left_unknown() -> None:
    from pvpo.viewer.sources import MAX_REWARD_CHARS, item_episode

    def item(response: str) -> dict[str, Any]:
        return {"id": "1", "question": "Q?", "golden_answers": ["x"], "output": {"final_response": response}}

    long = "<think> " + "x " * MAX_REWARD_CHARS + "</think><answer> x </answer>"
    assert item_episode(item(long), "toy", SEARCH_R1)["r"] is None
    assert item_episode(item("<think> x </think><answer> x </answer>"), "toy", SEARCH_R1)["r"] == 1.0
