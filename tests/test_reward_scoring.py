"""The one scoring layer: a question's scores from plain values, their aggregate under one set of
names, and the names files on disk were written with, read back through one alias map."""

from __future__ import annotations

import json
import math

import pytest

from pvpo.reward.scoring import (
    QuestionScore,
    aggregate,
    answer_in_reach,
    canonical,
    flashrag_summary,
    item_score,
    on_disk,
    read_score,
    score_answer,
)


def test_a_question_is_scored_from_its_answer_and_golds_and_a_missing_answer_scores_zero():
    s = score_answer("the Berlin wall", ["Berlin"], format_ok=True, searches=2, reward=0.5)
    assert (s.em, s.cem, s.format_ok, s.searches, s.reward) == (0.0, 1.0, 1.0, 2.0, 0.5)
    assert 0 < s.f1 < 1
    assert score_answer(None, ["Berlin"]) == QuestionScore(0.0, 0.0, 0.0)
    assert score_answer(None, ["Berlin"]).as_dict() == {"em": 0.0, "f1": 0.0, "cem": 0.0}  # unrecorded left out


def test_an_answer_is_in_reach_only_as_a_whole_phrase_of_the_retrieved_passages():
    assert answer_in_reach(["Berlin is the capital.", "Paris too."], ["paris"])
    assert not answer_in_reach(["Berliner Zeitung"], ["Berlin"])
    assert score_answer("x", ["Berlin"], passages=["In Berlin."]).in_reach == 1.0
    assert score_answer("x", ["Berlin"]).in_reach is None


def test_the_aggregate_means_each_score_over_the_questions_that_record_it_with_em_se_and_em_per_hop():
    scores = [
        QuestionScore(1.0, 1.0, 1.0, format_ok=1.0, searches=1.0),
        QuestionScore(0.0, 0.5, 1.0, format_ok=0.0),
        QuestionScore(0.0, 0.0, 0.0),
    ]
    f = aggregate(scores, hops=[1, 2, None])
    assert f["n"] == 3 and f["em"] == 1 / 3 and f["f1"] == 0.5 and f["cem"] == 2 / 3
    assert f["em_se"] == pytest.approx(math.sqrt((1 / 3) * (2 / 3) / 2))
    assert f["format_ok"] == 0.5 and f["searches"] == 1.0  # over the questions that record them
    assert "reward" not in f and "in_reach" not in f
    assert (f["em_1hop"], f["em_2hop"]) == (1.0, 0.0) and "em_Nonehop" not in f
    assert math.isnan(aggregate([])["em"])  # an average of nothing is not 0


def test_a_runs_figures_are_written_under_its_names_and_read_back_under_the_one_set():
    f = aggregate([score_answer("a", ["a"], format_ok=True, searches=1, reward=1.0)], hops=[2])
    written = on_disk(f)
    assert list(written) == [
        "eval/accuracy",
        "eval/accuracy_se",
        "eval/f1",
        "eval/cem",
        "eval/reward",
        "eval/format_ok",
        "eval/searches_per_traj",
        "eval/n",
        "eval/accuracy_2hop",
    ]
    assert on_disk(f, "val")["val/accuracy"] == 1.0
    row = {"step": 3, "accuracy": 0.1, **written, **on_disk(f, "val")}  # a metrics.jsonl row
    assert canonical(row, "eval") == f and canonical(row, "val") == f
    with pytest.raises(ValueError, match="unknown split 'test'"):
        on_disk(f, "test")


def test_pvpo_evals_files_are_read_under_the_one_set_acc_as_cem():
    item = {"output": {"metric_score": {"em": 0.0, "f1": 0.4, "acc": 1.0}, "format_ok": True, "num_searches": 2}}
    assert item_score(item) == QuestionScore(0.0, 0.4, 1.0, format_ok=1.0, searches=2.0)
    assert item_score({"output": {"metric_score": {"em": 1.0}}}) == QuestionScore(1.0, 0.0, 0.0)  # a bare file
    summary = flashrag_summary(aggregate([item_score(item)]))
    assert summary == {"n": 1, "em": 0.0, "f1": 0.4, "acc": 1.0, "em_se": 0.0, "format_ok": 1.0, "searches": 2.0}
    assert json.dumps(summary).index('"acc"') < json.dumps(summary).index('"em_se"')  # metrics.json's order
    assert canonical(summary)["cem"] == 1.0 and "acc" not in canonical(summary)


def test_a_stored_score_is_read_under_any_name_it_was_written_with():
    assert read_score({"em": 1, "f1": 0.5, "acc": 1, "searches": 3}) == QuestionScore(1.0, 0.5, 1.0, searches=3.0)
    assert read_score({}) == QuestionScore(0.0, 0.0, 0.0)
