"""The OpenAI-compatible paths of `pvpo eval`, policy and LLM judge, against a real server: vLLM's
OpenAI server (the CPU build here) serving a tiny policy that learned to search, beside a real
loopback retriever. Skipped when vLLM is absent (run by `make test-vllm`)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from pvpo.cli import app
from pvpo.envs.loaders import load_dataset
from tests.conftest import shared_data
from tests.eval_support import JUDGE_REPLY, searching_policy

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make test-vllm builds .venv-vllm)"
    ),
]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
runner = CliRunner()
# Message contents joined as they are: a chat request then carries the same text as a completions one.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    questions = [e.question for e in load_dataset(shared_data("flashrag", "nq.test.jsonl"))[:32]]
    return searching_policy(tmp_path_factory.mktemp("eval") / "policy", questions)


@pytest.fixture(scope="module")
def server(policy_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """`vllm.entrypoints.openai.api_server` on a free loopback port, stopped by its PID."""
    tmp = tmp_path_factory.mktemp("vllm-server")
    (tmp / "chat.jinja").write_text(CHAT_TEMPLATE)
    port = _free_port()
    log = (tmp / "server.log").open("w")
    cmd = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(policy_dir),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "2048",
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        str(256 << 20),
        "--chat-template",
        str(tmp / "chat.jinja"),
        "--seed",
        "0",
    ]
    proc = subprocess.Popen(cmd, env={**os.environ, **ENV}, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 240
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM server exited with {proc.returncode}: {(tmp / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline:
                pytest.fail(f"vLLM server not ready in 240 s: {(tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(1)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def retriever_url(tiny):
    from pvpo.retriever.server import BackgroundServer

    with BackgroundServer(tiny) as s:
        yield s.url


def _eval(out: Path, url: str, *extra: str) -> list[dict]:
    data = shared_data("flashrag", "bamboogle.test.jsonl")
    args = [
        "eval",
        "--dataset",
        str(data),
        "--retriever-url",
        url,
        "--out",
        str(out),
        "--limit",
        "12",
        "--sample-seed",
        "5",
        "--max-new-tokens",
        "32",
        "--max-response-tokens",
        "512",
        "--max-turns",
        "4",
        "--batch-size",
        "6",
        "--quiet",
        *extra,
    ]
    result = runner.invoke(app, args, env=ENV)
    assert result.exit_code == 0, (result.output, result.exception)
    return [json.loads(line) for line in (out / "bamboogle" / "predictions.jsonl").read_text().splitlines()]


def test_openai_policy_over_vllm_server_matches_the_token_loop(
    policy_dir: Path, server: str, retriever_url: str, tmp_path: Path
) -> None:
    local = _eval(tmp_path / "hf", retriever_url, "--model", str(policy_dir), "--engine", "hf")
    remote = _eval(
        tmp_path / "oa",
        retriever_url,
        "--engine",
        "openai",
        "--base-url",
        server,
        "--model-name",
        "tiny",
        "--api",
        "completions",
    )
    chat = _eval(
        tmp_path / "chat",
        retriever_url,
        "--engine",
        "openai",
        "--base-url",
        server,
        "--model-name",
        "tiny",
        "--api",
        "chat",
    )
    assert [i["id"] for i in remote] == [i["id"] for i in local]
    # Greedy on the same weights, stop strings restored on the client: the text loop writes what
    # the token-exact loop writes, searches and observations included.
    for a, b, c in zip(local, remote, chat, strict=True):
        for key in (
            "final_response",
            "pred",
            "metric_score",
            "num_searches",
            "num_turns",
            "stop_reason",
            "completion_tokens",
            "format_ok",
        ):
            assert a["output"][key] == b["output"][key] == c["output"][key], (key, a["id"])
        assert b["output"]["prompt_tokens"] == a["output"]["prompt_tokens"]
    assert all(
        b["output"]["num_searches"] >= 1 and "Doc 1(Title: Berlin)" in b["output"]["final_response"] for b in remote
    )
    metrics = json.loads((tmp_path / "oa" / "bamboogle" / "metrics.json").read_text())
    assert metrics["engine"] == "openai-completions" and metrics["model"] == f"{server}#tiny"


def test_llm_judge_over_vllm_server_scores_caches_and_reports(
    policy_dir: Path, server: str, retriever_url: str, tmp_path: Path
) -> None:
    from pvpo.evaluation.judge import Judge, judge_run, parse_score
    from pvpo.trainer.rollout.openai_client import OpenAIClient

    items = _eval(
        tmp_path / "run",
        retriever_url,
        "--model",
        str(policy_dir),
        "--engine",
        "hf",
        "--judge-base-url",
        server,
        "--judge-model",
        "tiny",
        "--judge-api",
        "chat",
    )
    answered = [it for it in items if it["output"]["pred"]]
    assert answered, "the tiny policy should answer some questions"
    for it in items:  # a verdict is the parsed reply of the server; no answer scores 0 without a request
        o = it["output"]
        assert o["metric_score"]["lasj"] == (parse_score(o["judge_reply"]) if o["pred"] else 0)
        assert o["judge_reply"] == (JUDGE_REPLY if o["pred"] else "")  # the tiny judge learned to reply "4"
    parsed = [it for it in answered if it["output"]["metric_score"]["lasj"] is not None]
    run = tmp_path / "run" / "bamboogle"
    metrics = json.loads((run / "metrics.json").read_text())
    dist = metrics["lasj_distribution"]
    assert (dist["4"], dist["0"], dist["unparsed"]) == (
        len(parsed),
        len(items) - len(answered),
        len(answered) - len(parsed),
    )
    assert metrics["lasj_mean"] == pytest.approx(4 * len(parsed) / (len(items) - dist["unparsed"]))
    assert metrics["lasj_cached"] == len(items) - len(answered)

    client = OpenAIClient(server, "tiny")
    again = judge_run(run, Judge(client, api="chat", concurrency=4), show_progress=False)
    assert client.requests == 0 and again["lasj_cached"] == len(items)  # every reply came from the cache
    table = runner.invoke(app, ["eval", "report", str(tmp_path / "run"), "--metric", "lasj"], env=ENV).output
    assert f"| {policy_dir.parent.name}/policy | {metrics['lasj']:.3f} |" in table


def test_openai_errors_name_the_endpoint_and_status(server: str) -> None:
    from pvpo.trainer.rollout.openai_client import OpenAIClient, OpenAIError

    client = OpenAIClient(server, "no-such-model", retries=1, backoff=0.01)
    with pytest.raises(OpenAIError, match=r"completions failed after 1 attempt\(s\): HTTP 404"):
        client.post("completions", {"prompt": "x", "max_tokens": 1})


def test_vllm_engine_evaluates_with_top_p_below_one(policy_dir: Path, retriever_url: str, tmp_path: Path) -> None:
    # Training refuses top_p < 1; evaluation takes PVPO's T = 0.6, top-p = 0.95, seeded per request.
    items = _eval(
        tmp_path / "v",
        retriever_url,
        "--model",
        str(policy_dir),
        "--engine",
        "vllm",
        "--temperature",
        "0.6",
        "--top-p",
        "0.95",
        "--seed",
        "3",
    )
    metrics = json.loads((tmp_path / "v" / "bamboogle" / "metrics.json").read_text())
    assert (metrics["engine"], metrics["settings"]["temperature"], metrics["settings"]["top_p"]) == ("vllm", 0.6, 0.95)
    assert len(items) == 12 and sum(it["output"]["num_searches"] >= 1 for it in items) >= 6


def test_gt_endpoint_source_writes_what_the_local_model_source_writes(
    policy_dir: Path, server: str, tiny, tmp_path: Path
) -> None:
    """PVPO's "larger model" behind an OpenAI-compatible endpoint (Group Sampling's `gt.source:
    model` with `base_url`): greedy, the text loop with restored stop strings gives the same
    trajectories, tokenized with the policy's tokenizer, as the same weights run locally. pi_gt of
    the endpoint's trajectories is the endpoint's own log-probs (vLLM's server returns them over
    the same tokenization); the local source's comes from the trainer's reference
    callback (`gt.logprobs: reference`)."""
    from pvpo.envs.data import QAExample
    from pvpo.envs.episode import EpisodeConfig
    from pvpo.trainer.config.schema import load_config
    from pvpo.trainer.model.policy import load_policy
    from pvpo.trainer.reference.gt_cache import GTCache, fetch_gt
    from pvpo.trainer.reference.gt_registry import GTContext, build_gt_source
    from pvpo.trainer.rollout.agent_loop import LoopConfig

    tok = load_policy(policy_dir).tokenizer
    exs = [
        QAExample(f"q{i}", q, ("Berlin",))
        for i, q in enumerate(["What is the capital of Germany?", "Who won the 1998 world cup?"])
    ]
    episode = EpisodeConfig(
        protocol="search_r1", reward="pvpo", max_turns=4, topk=3, max_obs_chars=None, prompt_template="search_r1"
    )
    ctx = GTContext(tok, tiny, episode, LoopConfig(max_new_tokens=32, max_response_tokens=512))
    common = ["algorithm.gt.source=model", "algorithm.gt.model.temperature=0", "algorithm.gt.logprobs=reference"]
    remote_cfg = load_config(None, common + [f"algorithm.gt.model.base_url={server}", "algorithm.gt.model.model=tiny"])
    local_cfg = load_config(None, common + [f"algorithm.gt.model.path={policy_dir}"])
    marked = []

    def reference(trajs):  # stands in for the trainer's reference log-probs
        for t in trajs:
            t.old_logprobs = [-0.5 if m else 0.0 for m in t.loss_mask]
            marked.append(t.uid)

    caches = {}
    for name, cfg in (("remote", remote_cfg), ("local", local_cfg)):
        src = build_gt_source("model", cfg.algorithm.gt, ctx)
        caches[name] = GTCache(tmp_path / f"{name}.json")
        try:
            fetch_gt(exs, src, caches[name], attempts=1, min_reward=1.0, set_logprobs=reference)
        finally:
            src.close()
    remote, local = caches["remote"].records, caches["local"].records
    assert set(remote) == set(local) == {"q0", "q1"} and sorted(marked) == ["q0", "q1"]  # the local ones
    for uid in remote:
        assert tok.decode(remote[uid].response_ids) == tok.decode(local[uid].response_ids)
        assert remote[uid].loss_mask.count(0) == local[uid].loss_mask.count(0) > 0  # the same observation tokens
        assert remote[uid].num_tool_calls == local[uid].num_tool_calls == 1 and remote[uid].reward == 1.0
        assert set(local[uid].gt_logprobs) <= {-0.5, 0.0}
        endpoint_lp = [lp for lp, m in zip(remote[uid].gt_logprobs, remote[uid].loss_mask, strict=True) if m]
        assert all(lp <= 0.0 for lp in endpoint_lp) and any(lp != -0.5 for lp in endpoint_lp)
