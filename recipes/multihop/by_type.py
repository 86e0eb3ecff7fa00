"""The multi-hop recipe's table by dataset and question type (`pvpo recipe table --by-type`): the kept
`pvpo eval` predictions joined with the datasets' own question files (2WikiMultihopQA's and
HotpotQA's `type`, MuSiQue's hop count from its decomposition). Per type, each policy's EM, how
often a golden answer was in the passages it retrieved (answer in reach) and its EM where it was
(written when in reach), then RL and the compute-matched SFT arm over the warm start and RL minus
SFT, with standard errors that count the seeds' spread when a policy has one folder per seed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from pvpo.envs.data import QAExample
from pvpo.envs.loaders import iter_examples
from pvpo.stats import mean, seeds_contrast, seeds_difference

Scores = dict[str, dict[str, float]]  # a `pvpo eval` folder's scores by question id (`table.read_scores`)


def question_type(example: QAExample) -> str:
    """A question's type: its dataset's own `type` field (2WikiMultihopQA: comparison, inference,
    compositional, bridge_comparison; HotpotQA: bridge, comparison), else its hop count from a
    MuSiQue decomposition (`2-hop`...), else `untyped`."""
    kind = example.metadata.get("type")
    if kind:
        return str(kind)
    steps = example.metadata.get("question_decomposition")
    return f"{len(steps)}-hop" if steps else "untyped"


def question_types(paths: Sequence[Path]) -> dict[str, tuple[str, str]]:
    """(dataset, type) of every question of the question files `paths`, by the id `pvpo eval`
    writes for it (`<dataset>/<the dataset's own id>`, the run's uid)."""
    types: dict[str, tuple[str, str]] = {}
    for path in paths:
        for ex in iter_examples(path):
            types[ex.uid] = (ex.uid.split("/", 1)[0], question_type(ex))
    return types


def type_groups(ids: Sequence[str], types: Mapping[str, tuple[str, str]]) -> list[tuple[str, str, list[str]]]:
    """(dataset, type, question ids) for each type of each dataset, then each dataset's `all`
    (where it has more than one type), then `all` of `all` (over more than one dataset)."""
    missing = [i for i in ids if i not in types]
    if missing:
        raise ValueError(f"question {missing[0]!r} (and {len(missing) - 1} more) is in none of the --questions files")
    by: dict[tuple[str, str], list[str]] = {}
    for i in ids:
        by.setdefault(types[i], []).append(i)
    groups = []
    for ds in sorted({d for d, _ in by}):
        kinds = sorted(t for d, t in by if d == ds)
        groups += [(ds, t, by[(ds, t)]) for t in kinds]
        if len(kinds) > 1:
            groups.append((ds, "all", [i for i in ids if types[i][0] == ds]))
    if len({d for d, _ in by}) > 1:
        groups.append(("all", "all", list(ids)))
    return groups


def _cols(seeds: Sequence[Scores], qs: Sequence[str], key: str) -> list[list[float]]:
    return [[s[q][key] for q in qs] for s in seeds]


def by_type_table(
    ids: Sequence[str], types: Mapping[str, tuple[str, str]], policies: Mapping[str, Sequence[Scores]]
) -> str:
    """Markdown: per (dataset, type) and policy, EM, answer in reach, EM where in reach and format
    ok, each the mean over the policy's seeds (`policies`: label -> one `read_scores` a seed; the
    labels `warm start`, `RL`, `SFT` are compared); then per (dataset, type) the EM and answer-in-reach
    differences RL - warm start and SFT - warm start (`seeds_difference`) and RL - SFT
    (`seeds_contrast`), each with its s.e. counting the seeds' spread."""
    groups = type_groups(ids, types)
    lines = [
        "| dataset | type | n | policy | EM | answer in reach | EM where in reach (summed over seeds) | format ok |",
        "|---|---|---:|---|---:|---:|---|---:|",
    ]
    for ds, kind, qs in groups:
        for label, seeds in policies.items():
            em, reach = _cols(seeds, qs, "em"), _cols(seeds, qs, "in_reach")
            hits = sum(e for se, sr in zip(em, reach) for e, r in zip(se, sr) if r)
            n_reach = sum(sum(sr) for sr in reach)
            where = f"{hits / n_reach:.3f} ({hits:.0f}/{n_reach:.0f})" if n_reach else "n/a (0/0)"
            fmt = _cols(seeds, qs, "format_ok")
            lines.append(
                f"| {ds} | {kind} | {len(qs)} | {label}{f' ({len(seeds)} seeds)' if len(seeds) > 1 else ''} "
                f"| {mean([mean(x) for x in em]):.3f} | {mean([mean(x) for x in reach]):.3f} | {where} "
                f"| {mean([mean(x) for x in fmt]):.3f} |"
            )
    comparisons = [
        (f"{a} - {b}", a, b)
        for a, b in (("RL", "warm start"), ("SFT", "warm start"), ("RL", "SFT"))
        if a in policies and b in policies
    ]
    if comparisons:
        head = " | ".join(f"{name}: {what}" for name, _, _ in comparisons for what in ("EM", "answer in reach"))
        lines += ["", f"| dataset | type | n | {head} |", "|---|---|---:|" + "---|" * (2 * len(comparisons))]
        for ds, kind, qs in groups:
            cells = []
            for _, a, b in comparisons:
                for key in ("em", "in_reach"):
                    x, y = _cols(policies[a], qs, key), _cols(policies[b], qs, key)
                    d = seeds_contrast(x, y) if len(policies[b]) > 1 else seeds_difference(y[0], x)
                    z = f", {d['mean'] / d['se']:+.1f} s.e." if d["se"] > 0 else ""
                    cells.append(f"{d['mean']:+.3f} ({d['se']:.3f}{z})")
            lines.append(f"| {ds} | {kind} | {len(qs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
