"""LLM-as-judge (LasJ): an OpenAI-compatible model grades each prediction 0-5 for semantic
equivalence with the golden answers, as ReSearch (arXiv:2503.19470) and PVPO (arXiv:2508.21104)
report next to EM, because EM misses correct answers worded differently ("JFK" vs "John F.
Kennedy").

The prompt (`JUDGE_PROMPT`) asks for a reply `Score: N`; parsing also accepts `{"score": N}`,
`\\boxed{N}`, `N/5` or a bare digit, and records None when none is there. Requests run
concurrently with retries (`OpenAIClient`); each (judge model, API, prompt) is answered once and kept
in a jsonl cache, so a re-run or an interrupted run asks nothing twice. An empty prediction scores
0 without a request.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvpo.progress import Progress
from pvpo.trainer.rollout.openai_client import OpenAIClient

JUDGE_PROMPT = """You are grading an answer to a question against the reference answers. Judge semantic equivalence only: the answer is correct if it refers to the same entity, value or fact as any reference answer, even if worded differently (aliases, abbreviations, extra but consistent detail). Ignore style and length.

Question: {question}
Reference answers: {golds}
Answer to grade: {prediction}

Score from 0 to 5:
5 - equivalent to a reference answer
4 - equivalent, with minor imprecision or harmless extra detail
3 - partly correct (right entity or value, but incomplete or partly wrong)
2 - related to the reference but not equivalent
1 - wrong
0 - no answer, or unrelated

Reply with one line: Score: <0-5>"""

SCORES = (0, 1, 2, 3, 4, 5)

_PATTERNS = (
    re.compile(r"score\W{0,3}\s*\**\s*([0-5])(?!\d|\.\d)", re.IGNORECASE),
    re.compile(r"\"score\"\s*:\s*\"?([0-5])(?!\d|\.\d)"),
    re.compile(r"\\boxed\{\s*([0-5])\s*\}"),
    re.compile(r"(?<![\d.])([0-5])\s*/\s*5(?!\d|\.\d)"),
)


def judge_prompt(question: str, golds: Sequence[str], prediction: str) -> str:
    return JUDGE_PROMPT.format(question=question, golds="; ".join(golds), prediction=prediction)


def parse_score(text: str | None) -> int | None:
    """The 0-5 score in a judge's reply (the last `Score: N`, else JSON, `\\boxed{N}`, `N/5`, or
    a reply that is just the digit); None when the reply has none."""
    if not text:
        return None
    for pattern in _PATTERNS:
        found = pattern.findall(text)
        if found:
            return int(found[-1])
    bare = text.strip().strip(".*`'\" \n")
    return int(bare) if bare in {str(s) for s in SCORES} else None


class JudgeCache:
    """(judge model, API, prompt) -> reply, in a jsonl file appended as replies come in."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path is not None else None
        self.lock = threading.Lock()
        self.data: dict[str, str] = {}
        if self.path is not None and self.path.exists():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line from a kill
                self.data[rec["key"]] = rec["reply"]

    @staticmethod
    def key(model: str, api: str, prompt: str) -> str:
        return hashlib.sha256(json.dumps([model, api, prompt]).encode()).hexdigest()

    def get(self, key: str) -> str | None:
        return self.data.get(key)

    def put(self, key: str, reply: str) -> None:
        with self.lock:
            self.data[key] = reply
            if self.path is not None:
                with self.path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"key": key, "reply": reply}, ensure_ascii=False) + "\n")


@dataclass
class Verdict:
    score: int | None
    reply: str
    cached: bool


class Judge:
    """Grades predictions with `client`'s model (`api`: chat or completions), greedy."""

    def __init__(
        self,
        client: OpenAIClient,
        *,
        cache: JudgeCache | None = None,
        api: str = "chat",
        max_tokens: int = 32,
        concurrency: int = 16,
    ) -> None:
        self.client, self.cache = client, cache or JudgeCache(None)
        self.api, self.max_tokens, self.concurrency = api, max_tokens, concurrency

    def _ask(self, prompt: str) -> str:
        params = {"max_tokens": self.max_tokens, "temperature": 0.0}
        if self.api == "chat":
            data = self.client.post("chat/completions", {"messages": [{"role": "user", "content": prompt}], **params})
            return (data["choices"][0].get("message") or {}).get("content") or ""
        data = self.client.post("completions", {"prompt": prompt, **params})
        return data["choices"][0].get("text") or ""

    def grade(self, question: str, golds: Sequence[str], prediction: str) -> Verdict:
        if not prediction.strip():
            return Verdict(0, "", True)
        prompt = judge_prompt(question, golds, prediction)
        key = JudgeCache.key(self.client.model, self.api, prompt)
        reply = self.cache.get(key)
        if reply is not None:
            return Verdict(parse_score(reply), reply, True)
        reply = self._ask(prompt)
        self.cache.put(key, reply)
        return Verdict(parse_score(reply), reply, False)

    def grade_items(self, items: Sequence[Mapping[str, Any]], *, show_progress: bool = True) -> list[Verdict]:
        """One verdict per FlashRAG item (question, golden_answers, output.pred), in order."""
        out: list[Verdict | None] = [None] * len(items)
        with ThreadPoolExecutor(max_workers=max(1, self.concurrency)) as pool:
            futures = {
                pool.submit(
                    self.grade,
                    str(it["question"]),
                    [str(g) for g in it.get("golden_answers", [])],
                    str(it.get("output", {}).get("pred") or ""),
                ): k
                for k, it in enumerate(items)
            }
            for f in Progress(as_completed(futures), total=len(futures), desc="judge", unit="q", enabled=show_progress):
                out[futures[f]] = f.result()
        return out  # type: ignore[return-value]


def apply_verdicts(items: Sequence[Mapping[str, Any]], verdicts: Sequence[Verdict]) -> list[dict[str, Any]]:
    """Items with `output.metric_score.lasj` (0-5, None when unparsed) and `output.judge_reply`."""
    out = []
    for it, v in zip(items, verdicts, strict=True):
        item = json.loads(json.dumps(it))
        o = item.setdefault("output", {})
        o.setdefault("metric_score", {})["lasj"] = v.score
        o["judge_reply"] = v.reply
        out.append(item)
    return out


def judge_summary(verdicts: Sequence[Verdict], *, model: str) -> dict[str, Any]:
    """`lasj_mean` (0-5, over parsed verdicts), `lasj` (that / 5, comparable to EM), the score
    distribution (counts of 0..5 and `unparsed`) and how many came from the cache."""
    scores = [v.score for v in verdicts if v.score is not None]
    dist = {str(s): sum(1 for x in scores if x == s) for s in SCORES}
    dist["unparsed"] = sum(1 for v in verdicts if v.score is None)
    mean = sum(scores) / len(scores) if scores else float("nan")
    return {
        "lasj_mean": mean,
        "lasj": mean / 5,
        "lasj_distribution": dist,
        "lasj_model": model,
        "lasj_cached": sum(1 for v in verdicts if v.cached),
    }


def judge_run(run_dir: str | Path, judge: Judge, *, show_progress: bool = True) -> dict[str, Any]:
    """Grade every prediction of an evaluation run folder: rewrite its predictions.jsonl with the
    verdicts (atomically), add the summary to its metrics.json and return the summary. Replies
    are cached in `judge_cache.jsonl` beside them unless the judge has its own cache."""
    from pvpo.locks import folder_lock

    with folder_lock(run_dir, "pvpo eval judge"):  # the folder's one writer (pvpo.locks)
        return _judge_run(Path(run_dir), judge, show_progress=show_progress)


def _judge_run(run: Path, judge: Judge, *, show_progress: bool) -> dict[str, Any]:
    from pvpo.atomic import atomic_write_jsonl, read_json
    from pvpo.evaluation.run import METRICS, PREDICTIONS, load_done, write_json

    items = load_done(run / PREDICTIONS)
    if not items:
        raise FileNotFoundError(f"{run / PREDICTIONS}: no predictions to judge")
    if judge.cache.path is None:
        judge.cache = JudgeCache(run / "judge_cache.jsonl")
    verdicts = judge.grade_items(items, show_progress=show_progress)
    judged = apply_verdicts(items, verdicts)
    atomic_write_jsonl(run / PREDICTIONS, judged)
    summary = judge_summary(verdicts, model=judge.client.model)
    metrics_path = run / METRICS
    metrics = read_json(metrics_path, fix="evaluate the run again to rewrite it") if metrics_path.exists() else {}
    write_json(metrics_path, {**metrics, **summary})
    return summary
