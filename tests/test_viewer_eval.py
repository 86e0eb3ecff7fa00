"""`pvpo eval` then `pvpo view` end to end: a tiny policy that learned to search answers questions
against a real loopback retriever, and the page shows each search's passages with the ids and
scores the retriever returned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.envs.loaders import load_dataset
from pvpo.viewer.page import page_data
from pvpo.viewer.sources import read_source
from tests.conftest import shared_data
from tests.eval_support import searching_policy

ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.mark.slow
def test_an_evaluation_records_each_searchs_passages_and_the_page_shows_their_ids_and_scores(
    tiny, tmp_path: Path
) -> None:
    from pvpo.retriever.server import BackgroundServer

    data = shared_data("flashrag", "bamboogle.test.jsonl")
    policy = searching_policy(tmp_path / "policy", [e.question for e in load_dataset(data)[:16]])
    out = tmp_path / "eval"
    with BackgroundServer(tiny) as server:
        args = ["eval", "--model", str(policy), "--dataset", str(data), "--retriever-url", server.url]
        args += ["--out", str(out), "--limit", "4", "--max-new-tokens", "32", "--max-turns", "4", "--quiet"]
        res = CliRunner().invoke(app, args, env=ENV)
        assert res.exit_code == 0, res.output
        expected = [hit for hits in tiny.search(["capital of Germany"], 3) for hit in hits]
    items = [json.loads(x) for x in (out / "bamboogle" / "predictions.jsonl").read_text().splitlines()]
    assert all(it["output"]["num_searches"] == len(it["output"]["passages"]) >= 1 for it in items)
    for it in items:  # the policy searches "capital of Germany"; the env recorded what came back
        assert it["output"]["passages"][0] == [{"id": p.id, "title": p.title, "score": p.score} for p in expected]
    [episodes] = page_data([read_source(out)])["episodes"]
    assert [e["k"] for e in episodes] == [f"bamboogle/{it['id']}" for it in items]
    for e in episodes:
        [results, *_] = [t for t in e["turns"] if t["t"] == "o"]
        shown = [(p["id"], p["title"], p["score"]) for p in results["p"]]
        assert shown == [(p.id, p.title, round(p.score, 4)) for p in expected]
        assert e["reach"] is False and e["fmt"] is True  # bamboogle's golds are not in the tiny corpus
