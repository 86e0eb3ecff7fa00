"""Evaluation runs -> tables, and re-scoring of any FlashRAG-format prediction file.

`report` merges runs into one markdown table in the layout of Search-R1's Table 2 (arXiv:2503.09516):
one row per method, one column per dataset (NQ, TriviaQA, PopQA, HotpotQA, 2Wiki, MuSiQue,
Bamboogle, in that order), the row's mean last, N per column; and the same numbers as CSV.
`rescore` recomputes FlashRAG's per-item `metric_score` (em, f1, acc = cover-EM) and the totals
FlashRAG writes to `metric_score.txt`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pvpo.envs.datasets import BENCHMARKS, benchmark
from pvpo.evaluation.run import METRICS, read_items, summarize_items, without_corrections
from pvpo.reward import TagProtocol
from pvpo.reward.scoring import ALIASES, canonical, flashrag_metric_score, score_answer

# the figures a report can tabulate, under `pvpo.reward.scoring`'s names (and FlashRAG's `acc` for
# `cem`, as metrics.json spells it), and `lasj`, the judge's (`judge.py`)
METRICS_REPORTED = ("em", "f1", "cem", "acc", "lasj", "format_ok", "searches")


# ---- rescore ---------------------------------------------------------------------------------------
@dataclass
class Rescored:
    """A re-scored file: its items with fresh metric_score, the totals, and how many items' stored
    scores (or, with `extract`, stored preds) differ from the recomputed ones."""

    items: list[dict[str, Any]]
    totals: dict[str, Any]
    changed_scores: int
    changed_preds: int


def rescore_items(items: Sequence[Mapping[str, Any]], *, extract: TagProtocol | None = None) -> Rescored:
    """Recompute each item's `output.metric_score` from `output.pred` and `golden_answers`; with
    `extract`, first re-read `pred` from `output.final_response` with that protocol (without the
    env's correction messages, as the env judges it)."""
    out, changed_scores, changed_preds = [], 0, 0
    for it in items:
        item = json.loads(json.dumps(it))  # a deep copy that stays plain JSON
        o = item.setdefault("output", {})
        pred = o.get("pred")
        if extract is not None:
            new = extract.extract_answer(without_corrections(str(o.get("final_response", "")), extract)) or ""
            changed_preds += new != (pred or "")
            pred = o["pred"] = new
        score = flashrag_metric_score(score_answer(pred, list(item.get("golden_answers", []))))
        before = o.get("metric_score") or {}
        if any(k not in before or float(before[k]) != v for k, v in score.items()):
            changed_scores += 1
        o["metric_score"] = {**before, **score}
        out.append(item)
    return Rescored(out, summarize_items(out), changed_scores, changed_preds)


def rescore_file(path: str | Path, *, extract: TagProtocol | None = None) -> Rescored:
    """`rescore_items` of a FlashRAG-format file (JSON list or jsonl)."""
    return rescore_items(read_items(path), extract=extract)


def metric_score_text(totals: Mapping[str, Any]) -> str:
    """FlashRAG's metric_score.txt: `em: 0.344` lines."""
    return "".join(f"{k}: {totals[k]}\n" for k in ("em", "acc", "f1"))


# ---- report ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunResult:
    method: str
    dataset: str
    value: float
    n: int


def find_runs(dirs: Sequence[str | Path], metric: str = "em") -> list[RunResult]:
    """One result per `metrics.json`: a DIR that is one run, or holds one run per sub-folder
    (`<DIR>/<dataset>/metrics.json`). The method is the metrics' `label`, else DIR's name."""
    if metric not in METRICS_REPORTED:
        raise ValueError(f"unknown metric {metric!r}; known: {sorted(METRICS_REPORTED)}")
    key = ALIASES.get(metric, metric)
    out = []
    for d in dirs:
        d = Path(d)
        files = [d / METRICS] if (d / METRICS).exists() else sorted(d.glob(f"*/{METRICS}"))
        if not files:
            raise FileNotFoundError(f"{d}: no {METRICS} in it or in its sub-folders")
        for f in files:
            m = canonical(_read_metrics(f))
            value = m.get(key)
            if value is None:
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or not isinstance(m.get("n", 0), int):
                raise ValueError(f"{f}: {key} is {value!r} and n {m.get('n')!r}, not numbers; fix: {_REDO}")
            out.append(
                RunResult(str(m.get("label") or d.name), str(m.get("dataset") or f.parent.name), value, m.get("n", 0))
            )
    return out


_REDO = "run that evaluation again (pvpo eval ... --out its folder), or leave its folder out of the report"


def _read_metrics(path: Path) -> dict[str, Any]:
    """A `metrics.json`'s object; a damaged one (cut, not JSON, not an object) is a ValueError of one
    line naming the file."""
    try:
        data = json.loads(path.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: damaged, not JSON ({e}); fix: {_REDO}") from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: a JSON {type(data).__name__}, not the object of metrics pvpo eval writes; fix: {_REDO}"
        )
    return data


def _columns(results: Sequence[RunResult]) -> list[str]:
    names = {r.dataset for r in results}
    known = [b.name for b in BENCHMARKS if b.name in names]
    return known + sorted(names - set(known))


def _title(dataset: str) -> str:
    b = benchmark(dataset)
    return b.title if b else dataset


@dataclass
class Table:
    """Methods x datasets: `cells[method][dataset] = (value, n)`, `avg[method]` over the row."""

    columns: list[str]
    methods: list[str]
    cells: dict[str, dict[str, tuple[float, int]]]

    def avg(self, method: str) -> float:
        vals = [v for v, _ in self.cells[method].values()]
        return sum(vals) / len(vals) if vals else math.nan

    def column_n(self, dataset: str) -> int | None:
        """The column's N when every method has the same, else None."""
        ns = {self.cells[m][dataset][1] for m in self.methods if dataset in self.cells[m]}
        return ns.pop() if len(ns) == 1 else None


def build_table(results: Sequence[RunResult]) -> Table:
    cells: dict[str, dict[str, tuple[float, int]]] = {}
    for r in results:
        row = cells.setdefault(r.method, {})
        if r.dataset in row:
            raise ValueError(f"two runs of {r.dataset!r} for method {r.method!r}; give one of them another label")
        row[r.dataset] = (r.value, r.n)
    return Table(_columns(results), list(cells), cells)


def markdown_table(table: Table, *, metric: str = "em", digits: int = 3) -> str:
    """The table as GitHub markdown; a cell whose N differs from its column's shows its own N;
    a row missing a dataset shows `-` and its Avg is over the datasets it has (marked `*`)."""
    head = ["Method"]
    for c in table.columns:
        n = table.column_n(c)
        head.append(f"{_title(c)} (N={n})" if n is not None else _title(c))
    head.append(f"Avg ({metric})")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join([" --- "] + [" ---: "] * (len(head) - 1)) + "|"]
    for m in table.methods:
        row = [m]
        for c in table.columns:
            cell = table.cells[m].get(c)
            if cell is None:
                row.append("-")
            else:
                v, n = cell
                row.append(f"{v:.{digits}f}" + ("" if table.column_n(c) is not None else f" (N={n})"))
        partial = len(table.cells[m]) < len(table.columns)
        row.append(f"{table.avg(m):.{digits}f}" + ("*" if partial else ""))
        lines.append("| " + " | ".join(row) + " |")
    if any(len(table.cells[m]) < len(table.columns) for m in table.methods):
        lines.append("")
        lines.append("\\* mean over the datasets that row has.")
    return "\n".join(lines) + "\n"


def write_csv(table: Table, path: str | Path) -> None:
    """Wide CSV: method, one column per dataset, avg, then n_<dataset> per dataset."""
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["method", *table.columns, "avg", *[f"n_{c}" for c in table.columns]])
        for m in table.methods:
            cells = table.cells[m]
            w.writerow(
                [
                    m,
                    *[cells[c][0] if c in cells else "" for c in table.columns],
                    table.avg(m),
                    *[cells[c][1] if c in cells else "" for c in table.columns],
                ]
            )
