"""`pvpo eval` keeps its answers when the model writes a lone surrogate (`\\ud800`, which UTF-8
cannot encode) in a query, and `eval report` names a damaged metrics.json (cut, or a JSON list) in
one line instead of a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from http_support import json_server
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.evaluation.report import find_runs


@contextmanager
def _endpoint_and_retriever() -> Iterator[tuple[str, list[list[str]]]]:
    """A stand-in OpenAI-compatible endpoint whose model searches `who \\ud800 is` and then answers,
    and a stand-in retriever, on one loopback server; yields its base URL and the queries searched."""
    searched: list[list[str]] = []

    def answer(path: str, body: Any) -> tuple[int, Any]:
        if path == "/retrieve":
            searched.append(body["queries"])
            return 200, {
                "result": [
                    [{"document": {"id": "1", "contents": '"T"\nParis.'}, "score": 1.0}] for _ in body["queries"]
                ]
            }
        text = "<answer> Paris </answer>" if "Doc 1" in json.dumps(body) else "<search> who \ud800 is </search>"
        message = {"role": "assistant", "content": text}
        return 200, {"choices": [{"index": 0, "text": text, "message": message, "finish_reason": "stop"}]}

    with json_server(answer) as url:
        yield url, searched


def test_a_model_written_lone_surrogate_still_saves_every_answer(tmp_path: Path) -> None:
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(json.dumps({"id": str(i), "question": f"q{i}?", "golden_answers": ["Paris"]}) + "\n" for i in range(2))
    )
    with _endpoint_and_retriever() as (base, searched):
        res = CliRunner().invoke(
            app,
            ["eval", "--engine", "openai", "--base-url", base + "/v1", "--model-name", "m", "--dataset", str(data),
             "--retriever-url", base, "--out", str(tmp_path / "out"), "--quiet"],
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in (tmp_path / "out" / "q" / "predictions.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["output"]["pred"] == "Paris" for r in rows)
    assert searched and all(q == ["who \ufffd is"] for q in searched)


@pytest.mark.parametrize(
    ("content", "said"),
    [('{"em": 0.5, "n": 1', "damaged, not JSON"), ("[1, 2]", "a JSON list, not the object of metrics")],
)
def test_eval_report_names_a_damaged_metrics_file_in_one_line(tmp_path: Path, content: str, said: str) -> None:
    metrics = tmp_path / "run" / "metrics.json"
    metrics.parent.mkdir()
    metrics.write_text(content)
    with pytest.raises(ValueError, match=said) as info:
        find_runs([tmp_path / "run"])
    assert str(metrics) in str(info.value)
    res = CliRunner().invoke(app, ["eval", "report", str(tmp_path / "run")])
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) <= 2 and lines[0].startswith(f"error: {metrics}: {said}")
