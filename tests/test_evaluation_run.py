"""`pvpo eval` on the hf engine: a tiny policy that learned to search answers the shared FlashRAG
samples against a real loopback retriever; FlashRAG-layout outputs, resume after a kill,
re-scoring, the report table, dataset names and the hf engine's top-p."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.envs.datasets import resolve_dataset, sample_subset
from pvpo.envs.loaders import load_dataset
from pvpo.evaluation.report import build_table, find_runs, markdown_table, rescore_file, rescore_items, write_csv
from pvpo.evaluation.run import EvalError, EvalSettings, load_done, read_items
from tests.conftest import REPO, shared_data
from tests.eval_support import searching_policy

runner = CliRunner()
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    questions = [e.question for e in load_dataset(shared_data("flashrag", "nq.test.jsonl"))[:32]]
    return searching_policy(tmp_path_factory.mktemp("eval") / "policy", questions)


@pytest.fixture(scope="module")
def retriever_url(tiny):
    from pvpo.retriever.server import BackgroundServer

    with BackgroundServer(tiny) as server:
        yield server.url


def _eval_args(model: Path, dataset: str, url: str, out: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--model",
        str(model),
        "--dataset",
        dataset,
        "--retriever-url",
        url,
        "--out",
        str(out),
        "--max-new-tokens",
        "32",
        "--max-response-tokens",
        "512",
        "--max-turns",
        "4",
        "--batch-size",
        "4",
        "--quiet",
        *extra,
    ]


def _invoke(args: list[str]):
    result = runner.invoke(app, args, env=ENV)
    assert result.exit_code == 0, (result.output, result.exception)
    return result


# ---- datasets ------------------------------------------------------------------------------------
def test_benchmark_names_resolve_in_flashrag_and_flat_layouts(tmp_path: Path) -> None:
    (tmp_path / "hotpotqa").mkdir()
    (tmp_path / "hotpotqa" / "dev.jsonl").write_text('{"id": "a", "question": "q", "golden_answers": ["x"]}\n')
    (tmp_path / "nq.test.jsonl").write_text('{"id": "b", "question": "q", "golden_answers": ["x"]}\n')
    hp = resolve_dataset("HotpotQA", data_dir=tmp_path)
    assert (hp.name, hp.split, hp.path) == ("hotpotqa", "dev", tmp_path / "hotpotqa" / "dev.jsonl")
    assert resolve_dataset("nq", data_dir=tmp_path).path == tmp_path / "nq.test.jsonl"
    as_file = resolve_dataset(str(tmp_path / "nq.test.jsonl"))
    assert (as_file.name, as_file.split) == ("nq", "test")
    with pytest.raises(FileNotFoundError, match="known benchmark.*'nq'"):
        resolve_dataset("squad", data_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no dev split of 'musique'"):
        resolve_dataset("musique", data_dir=tmp_path)


def test_sample_subset_is_a_seeded_draw_in_file_order() -> None:
    items = list(range(100))
    a, b = sample_subset(items, 10, 7), sample_subset(items, 10, 7)
    assert a == b == sorted(a) and len(set(a)) == 10
    assert sample_subset(items, 10, 8) != a
    assert sample_subset(items, 10, None) == list(range(10))
    assert sample_subset(items, 500, 1) == items


def test_settings_name_the_bad_value() -> None:
    with pytest.raises(EvalError, match="top_p=0"):
        EvalSettings(top_p=0.0)
    with pytest.raises(EvalError, match="unknown template 'nope'.*search_r1"):
        EvalSettings(template="nope")


# ---- the hf engine honours top-p at evaluation --------------------------------------------------
def test_hf_engine_top_p_samples_only_the_nucleus(policy_dir: Path) -> None:
    from pvpo.evaluation.policies import token_policy
    from pvpo.trainer.rollout.engine import SamplingConfig

    pol = token_policy(policy_dir, "hf")
    prompts = [
        pol.tokenizer.encode(f"Question: what is {w}?\n") for w in ("the capital", "a cat", "DNA", "Jupiter")
    ] * 4
    greedy = pol.engine.generate(prompts, SamplingConfig(temperature=0.0, max_new_tokens=12))
    nucleus = pol.engine.generate(prompts, SamplingConfig(temperature=2.0, top_p=1e-6, max_new_tokens=12, seed=3))
    wide = pol.engine.generate(prompts, SamplingConfig(temperature=2.0, top_p=1.0, max_new_tokens=12, seed=3))
    assert [c.token_ids for c in nucleus] == [c.token_ids for c in greedy]  # the nucleus is the argmax alone
    assert [c.token_ids for c in wide] != [c.token_ids for c in greedy]


# ---- end to end ------------------------------------------------------------------------------------
def test_eval_on_flashrag_samples_writes_flashrag_items_and_metrics(
    policy_dir: Path, retriever_url: str, tmp_path: Path
) -> None:
    data = shared_data("flashrag", "bamboogle.test.jsonl")
    out = tmp_path / "run"
    result = _invoke(_eval_args(policy_dir, str(data), retriever_url, out, "--limit", "10", "--sample-seed", "3"))
    assert "bamboogle (test, N=10): EM" in result.output
    run = out / "bamboogle"
    items = [json.loads(line) for line in (run / "predictions.jsonl").read_text().splitlines()]
    source = {r["id"]: r for r in map(json.loads, data.read_text().splitlines())}
    assert [it["id"] for it in items] == [
        f"test_{i}" for i in sorted(int(k.split("_")[1]) for k in (it["id"] for it in items))
    ]
    assert len(items) == 10 and {it["id"] for it in items} <= set(source)
    for it in items:
        assert it["question"] == source[it["id"]]["question"].strip()
        assert it["golden_answers"] == [
            g.strip() for g in source[it["id"]]["golden_answers"]
        ]  # as the loader reads them
        o = it["output"]
        assert set(o["metric_score"]) == {"em", "f1", "acc"}
        assert o["final_response"].startswith("<search>") and o["query"].endswith(
            it["question"].rstrip("?") + "?\n"
        )  # Search-R1's prompt
        assert o["num_searches"] >= 1 and o["queries"][0] == "capital of Germany"  # a real search went out...
        assert "Doc 1(Title: Berlin)" in o["final_response"]  # ...and the loopback retriever answered it
        assert o["completion_tokens"] > 0 and o["num_turns"] >= 2 and isinstance(o["format_ok"], bool)
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["n"], metrics["limit"], metrics["sample_seed"], metrics["split"]) == (10, 10, 3, "test")
    assert metrics["settings"]["temperature"] == 0.0 and metrics["searches"] >= 1
    rescored = rescore_file(run / "predictions.jsonl", extract=None)
    assert rescored.changed_scores == 0
    for key in ("em", "f1", "acc"):
        assert rescored.totals[key] == pytest.approx(metrics[key], abs=1e-12)
    assert (
        rescore_file(
            run / "predictions.jsonl", extract=__import__("pvpo.reward", fromlist=["SEARCH_R1"]).SEARCH_R1
        ).changed_preds
        == 0
    )

    table = _invoke(["eval", "report", str(out), "--csv", str(tmp_path / "t.csv")]).output
    assert (
        "| Bamboogle (N=10) | Avg (em) |" in table
        and f"| {policy_dir.parent.name}/policy | {metrics['em']:.3f} |" in table
    )  # a checkpoint's policy folder
    assert (tmp_path / "t.csv").read_text().splitlines()[0] == "method,bamboogle,avg,n_bamboogle"

    again = runner.invoke(
        app, _eval_args(policy_dir, str(data), retriever_url, out, "--limit", "10", "--sample-seed", "4"), env=ENV
    )
    assert again.exit_code == 2 and "other settings (sample_seed: 3 there, 4 now)" in again.output


@pytest.mark.slow
def test_run_killed_mid_way_resumes_to_the_same_predictions(
    policy_dir: Path, retriever_url: str, tmp_path: Path
) -> None:
    data = str(shared_data("flashrag", "popqa.test.jsonl"))
    args = _eval_args(policy_dir, data, retriever_url, tmp_path / "whole", "--limit", "40", "--sample-seed", "1")
    _invoke(args)
    whole = (tmp_path / "whole" / "popqa" / "predictions.jsonl").read_bytes()

    cut = tmp_path / "cut"
    preds = cut / "popqa" / "predictions.jsonl"
    cmd = [
        sys.executable,
        "-c",
        "from pvpo.cli import app; app()",
        *_eval_args(policy_dir, data, retriever_url, cut, "--limit", "40", "--sample-seed", "1")[:],
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env={**os.environ, **ENV}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if preds.exists() and len(preds.read_bytes().splitlines()) >= 4:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "the run ended before it could be killed"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    done = len(load_done(preds))
    assert 4 <= done < 40
    with preds.open("ab") as f:  # a kill in the middle of a write leaves a torn line
        f.write(b'{"id": "test_9999", "question": "to')
    _invoke(_eval_args(policy_dir, data, retriever_url, cut, "--limit", "40", "--sample-seed", "1"))
    assert preds.read_bytes() == whole


# ---- rescore and report ----------------------------------------------------------------------------
@pytest.mark.parametrize("run", ["bamboogle_search_r1_instruct", "nq_search_r1_base"])
def test_rescore_reproduces_flashrag_totals_of_shared_search_r1_runs(run: str) -> None:
    path = shared_data("scored", f"{run}.json")
    stored = dict(
        line.split(": ") for line in shared_data("scored", f"{run}.metric_score.txt").read_text().splitlines()
    )
    result = _invoke(["eval", "rescore", str(path), "--extract", "search_r1"])
    assert result.stdout == "".join(f"{k}: {stored[k]}\n" for k in ("em", "acc", "f1"))
    res = rescore_file(path)
    assert res.changed_scores == 0 and res.totals["n"] == len(read_items(path))


def test_rescore_fixes_a_wrong_stored_score() -> None:
    items = [
        {
            "id": "1",
            "question": "q",
            "golden_answers": ["Paris"],
            "output": {"pred": "paris", "metric_score": {"em": 0.0, "f1": 0.0, "acc": 0.0}},
        },
        {
            "id": "2",
            "question": "q",
            "golden_answers": ["Rome"],
            "output": {"pred": "", "metric_score": {"em": 0.0, "f1": 0.0, "acc": 0.0}},
        },
    ]
    res = rescore_items(items)
    assert res.changed_scores == 1 and res.items[0]["output"]["metric_score"] == {"em": 1.0, "f1": 1.0, "acc": 1.0}
    assert res.totals["em"] == 0.5 and items[0]["output"]["metric_score"]["em"] == 0.0  # input untouched


def test_rescore_extract_ignores_the_envs_correction_messages() -> None:
    from pvpo.reward import SEARCH_R1

    response = "<think> hm </think>" + SEARCH_R1.correction_message() + "<think> still unsure"
    item = {"id": "1", "question": "q", "golden_answers": ["and"], "output": {"pred": "", "final_response": response}}
    res = rescore_items([item], extract=SEARCH_R1)
    assert (
        res.items[0]["output"]["pred"] == "" and res.totals["em"] == 0.0
    )  # not the message's "<answer> and </answer>"


def _fake_run(root: Path, method: str, dataset: str, em: float, n: int) -> None:
    d = root / method / dataset
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"dataset": dataset, "em": em, "n": n}))


def test_report_has_datasets_in_paper_order_avg_last_and_n(tmp_path: Path) -> None:
    for ds, em in [("bamboogle", 0.2), ("nq", 0.4), ("2wikimultihopqa", 0.3)]:
        _fake_run(tmp_path, "ours", ds, em, 125 if ds == "bamboogle" else 500)
    for ds, em in [("nq", 0.5), ("2wikimultihopqa", 0.1)]:
        _fake_run(tmp_path, "base", ds, em, 1000 if ds == "nq" else 500)
    table = build_table(find_runs([tmp_path / "ours", tmp_path / "base"]))
    md = markdown_table(table).splitlines()
    assert md[0] == "| Method | NQ | 2Wiki (N=500) | Bamboogle (N=125) | Avg (em) |"
    assert md[2] == "| ours | 0.400 (N=500) | 0.300 | 0.200 | 0.300 |"
    assert md[3] == "| base | 0.500 (N=1000) | 0.100 | - | 0.300* |"
    write_csv(table, tmp_path / "t.csv")
    assert (tmp_path / "t.csv").read_text().splitlines()[2] == "base,0.5,0.1,,0.3,1000,500,"
    with pytest.raises(ValueError, match="unknown metric 'bleu'"):
        find_runs([tmp_path / "ours"], "bleu")


def test_report_tabulates_cover_em_as_cem_or_flashrags_acc_from_the_acc_metrics_json_holds(tmp_path: Path) -> None:
    d = tmp_path / "ours" / "nq"
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps({"dataset": "nq", "em": 0.25, "acc": 0.5, "n": 4}))
    assert [r.value for r in find_runs([tmp_path / "ours"], "cem")] == [0.5]
    assert [r.value for r in find_runs([tmp_path / "ours"], "acc")] == [0.5]


def test_eval_cli_errors_are_one_line_naming_the_problem(tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", "--dataset", "nq", "--out", str(tmp_path)], env=ENV)
    assert result.exit_code == 2 and "missing --retriever-url, --model" in result.output
    result = runner.invoke(
        app,
        [
            "eval",
            "--model",
            str(tmp_path),
            "--dataset",
            "squad",
            "--retriever-url",
            "http://127.0.0.1:9",
            "--out",
            str(tmp_path),
        ],
        env=ENV,
    )
    # pvpo's one error path (pvpo/user_errors.py): the cause, the fix, how to see the traceback
    assert result.exit_code == 2 and "Traceback" not in result.output and result.output.count("\n") <= 3
    assert result.output.startswith("error: dataset 'squad' is neither a file nor a known benchmark")


@pytest.mark.slow
def test_all_script_evaluates_the_seven_benchmarks_and_writes_the_table(
    policy_dir: Path, retriever_url: str, tmp_path: Path
) -> None:
    from pvpo.envs.datasets import BENCHMARKS

    lines = shared_data("flashrag", "bamboogle.test.jsonl").read_text().splitlines()
    data = tmp_path / "data"
    data.mkdir()
    for k, b in enumerate(BENCHMARKS):  # two real questions under each benchmark's name and split
        (data / f"{b.name}.{b.split}.jsonl").write_text("\n".join(lines[2 * k : 2 * k + 2]) + "\n")
    out = tmp_path / "out" / "tiny"
    env = {
        **os.environ,
        **ENV,
        "PVPO_DATA_DIR": str(data),
        "RETRIEVER_URL": retriever_url,
        "ENGINE": "hf",
        "PVPO": str(Path(sys.executable).parent / "pvpo"),
    }
    subprocess.run(
        [
            str(REPO / "scripts" / "eval" / "all.sh"),
            str(policy_dir),
            str(out),
            "--",
            "--max-new-tokens",
            "32",
            "--max-response-tokens",
            "512",
            "--max-turns",
            "4",
            "--quiet",
            "--label",
            "tiny-sft",
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    md = (out / "table.md").read_text().splitlines()
    assert (
        md[0]
        == "| Method | NQ (N=2) | TriviaQA (N=2) | PopQA (N=2) | HotpotQA (N=2) | 2Wiki (N=2) | MuSiQue (N=2) | Bamboogle (N=2) | Avg (em) |"
    )
    assert md[2].startswith("| tiny-sft | ")
    splits = {json.loads((out / b.name / "metrics.json").read_text())["split"] for b in BENCHMARKS}
    assert splits == {"test", "dev"}
    assert (
        (out / "table.csv")
        .read_text()
        .startswith("method,nq,triviaqa,popqa,hotpotqa,2wikimultihopqa,musique,bamboogle,avg,")
    )


def test_eval_sends_the_retriever_token_and_a_missing_one_fails_in_one_line(
    policy_dir: Path, tiny, tmp_path: Path
) -> None:
    from pvpo.retriever.server import BackgroundServer

    data = str(shared_data("flashrag", "bamboogle.test.jsonl"))
    with BackgroundServer(tiny, token="s3cret") as server:
        ok = _invoke(
            _eval_args(policy_dir, data, server.url, tmp_path / "ok", "--limit", "2", "--retriever-token", "s3cret")
        )
        assert "bamboogle (test, N=2): EM" in ok.output
        assert json.loads((tmp_path / "ok" / "bamboogle" / "metrics.json").read_text())["searches"] >= 1
        refused = runner.invoke(
            app,
            _eval_args(policy_dir, data, server.url, tmp_path / "no", "--limit", "2"),
            env=ENV | {"PVPO_RETRIEVER_TOKEN": ""},
        )
    assert refused.exit_code == 2, refused.output
    assert "refused the request (401)" in refused.output and "PVPO_RETRIEVER_TOKEN" in refused.output
    assert "Traceback" not in refused.output
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert written and not [p for p in written if b"s3cret" in p.read_bytes()], "the token reached a file"


# ---- the output folder and bad datasets (issues 23 and 32) -------------------------------------------
def _bogus_eval(tmp_path: Path, data: Path, out: Path, *extra: str):
    """`pvpo eval` with a model and retriever that do not exist: anything refused here is refused
    before either is reached."""
    args = ["eval", "--model", str(tmp_path / "no-model"), "--dataset", str(data)]
    return runner.invoke(app, [*args, "--retriever-url", "http://127.0.0.1:9", "--out", str(out), *extra], env=ENV)


def test_eval_refuses_an_out_holding_a_users_file_and_keeps_it(tmp_path: Path) -> None:
    data = tmp_path / "qa.jsonl"
    data.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("my notes")
    res = _bogus_eval(tmp_path, data, out)
    assert res.exit_code == 2 and "notes.txt" in res.output and "--overwrite" in res.output, res.output
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "my notes"
    (out / "notes.txt").unlink()
    (out / "qa").mkdir()
    (out / "qa" / "metrics.json").write_text("{}")  # a dataset's folder that is no run of ours
    res = _bogus_eval(tmp_path, data, out)
    assert res.exit_code == 2 and "qa" in res.output, res.output
    assert (out / "qa" / "metrics.json").read_text() == "{}"


def test_eval_refuses_an_empty_dataset_before_loading_a_model(tmp_path: Path) -> None:
    data = tmp_path / "empty.jsonl"
    data.write_text("")
    res = _bogus_eval(tmp_path, data, tmp_path / "out")
    assert res.exit_code == 2 and "empty.jsonl" in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "out").exists()


class _FailingPolicy:
    def rollout(self, *args: object, **kwargs: object) -> list[object]:
        raise RuntimeError("the model went away")


def test_run_eval_replaces_another_run_only_with_overwrite_and_restores_it_on_failure(tmp_path: Path) -> None:
    from pvpo.envs.data import QAExample
    from pvpo.evaluation.run import EVAL_KIND, run_eval
    from pvpo.owned import claim

    out = tmp_path / "nq"
    claim(out, EVAL_KIND)  # an earlier evaluation's manifest
    (out / "run.json").write_text(json.dumps({"dataset": "nq", "model": "other"}))
    (out / "predictions.jsonl").write_text('{"id": "x"}\n')
    examples = [QAExample("nq/1", "q?", ("a",))]
    meta = {"dataset": "nq", "model": "this"}
    with pytest.raises(EvalError, match="other settings.*--overwrite"):
        run_eval(_FailingPolicy(), examples, None, EvalSettings(), out, meta=meta, show_progress=False)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="went away"):
        run_eval(_FailingPolicy(), examples, None, EvalSettings(), out, meta=meta, show_progress=False, overwrite=True)  # type: ignore[arg-type]
    assert (out / "predictions.jsonl").read_text() == '{"id": "x"}\n' and '"other"' in (out / "run.json").read_text()
    assert not (tmp_path / ".nq.pvpo-replaced").exists()


def test_no_file_of_an_eval_run_holds_the_api_key_given(tmp_path: Path) -> None:
    """Secrets are never written to disk. A stand-in OpenAI-compatible endpoint answers
    every turn at once (no search) and records the bearer it was sent."""
    import http.server
    import threading

    seen: list[str] = []

    class Chat(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen.append(self.headers.get("Authorization", ""))
            body = json.dumps(
                {
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "<answer> a </answer>"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 4},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Chat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    data = tmp_path / "qa.jsonl"
    data.write_text('{"id": "1", "question": "q?", "golden_answers": ["a"]}\n')
    out = tmp_path / "out"
    try:
        res = runner.invoke(
            app,
            [
                "eval",
                "--engine",
                "openai",
                "--base-url",
                f"http://127.0.0.1:{server.server_port}/v1",
                "--model-name",
                "m",
                "--api-key",
                "sk-s3cret-key-123",
                "--dataset",
                str(data),
                "--retriever-url",
                "http://127.0.0.1:9",
                "--out",
                str(out),
                "--quiet",
            ],
            env=ENV,
        )
    finally:
        server.shutdown()
    assert res.exit_code == 0 and "N=1): EM" in res.output, (res.output, res.exception)
    assert seen and all(h == "Bearer sk-s3cret-key-123" for h in seen)
    written = [p for p in out.rglob("*") if p.is_file()]
    assert written and not [p for p in written if b"s3cret" in p.read_bytes()], "the key reached a file"


def test_a_query_cut_to_the_retrievers_limit_is_counted_in_the_item_and_the_metrics() -> None:
    from pvpo.envs import QAExample
    from pvpo.evaluation.policies import _outcome
    from pvpo.evaluation.run import prediction_item, summarize_items
    from pvpo.reward import get_protocol
    from pvpo.trainer.rollout.trajectory import Trajectory

    protocol = get_protocol("search_r1")
    ex = QAExample(uid="nq/1", question="q?", golden_answers=("a",))
    cut = Trajectory(uid="nq/1", prompt_ids=[1], num_tool_calls=2, info={"num_queries_cut": 2})
    plain = Trajectory(uid="nq/1", prompt_ids=[1], num_tool_calls=1, info={"num_queries_cut": 0})
    items = [prediction_item(ex, _outcome("p", t, protocol)) for t in (cut, plain)]
    assert [it["output"]["num_queries_cut"] for it in items] == [2, 0]
    assert summarize_items(items)["queries_cut"] == 2  # a count over the questions, not a mean
    # items written before the field existed sum to no count at all rather than a false 0
    assert "queries_cut" not in summarize_items([{"output": {"metric_score": {"em": 1.0}}}])
