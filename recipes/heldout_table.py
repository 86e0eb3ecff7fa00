"""The held-out table of a run, per dataset and overall: EM (with its standard error), F1, CEM,
format rate and searches of each evaluated policy (the base model, after the warm start, after RL),
aggregated by the one scoring layer (`pvpo.reward.scoring`) from each question's stored scores, and
the paired differences between them on the same questions (`pvpo.stats`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pvpo.reward.scoring import aggregate, read_score
from pvpo.stats import paired_difference

Scores = Sequence[Mapping[str, float]]
STAGES = (("base", "base model"), ("before", "after warm start"), ("after", "after RL"))
COMPARISONS = (
    ("before", "after", "RL - warm start"),
    ("base", "before", "warm start - base"),
    ("base", "after", "RL - base"),
)


def dataset_groups(uids: Sequence[str]) -> dict[str, list[int]]:
    """Question positions by dataset (the uid's prefix, in order of first appearance), then `all`."""
    groups: dict[str, list[int]] = {}
    for i, uid in enumerate(uids):
        groups.setdefault(uid.split("/", 1)[0], []).append(i)
    if len(groups) > 1:
        groups["all"] = list(range(len(uids)))
    return groups


def _ems(scores: Scores, idx: Sequence[int]) -> list[float]:
    return [read_score(scores[i]).em for i in idx]


def per_dataset_table(uids: Sequence[str], scores: Mapping[str, Scores]) -> str:
    """Markdown: one row per (dataset, evaluated policy) with n, EM (s.e.), F1, CEM, format ok and
    searches per answer; then one row per dataset with each paired EM difference (s.e., and the
    difference in s.e.). `scores` maps an evaluation tag (`base`, `before`, `after`) to each
    question's scores in `uids`' order; tags missing or of another length are left out."""
    stages = [(tag, name) for tag, name in STAGES if len(scores.get(tag, ())) == len(uids) and uids]
    if not stages:
        return ""
    groups = dataset_groups(uids)
    lines = [
        "| dataset | n | policy | EM (s.e.) | F1 | CEM | format ok | searches per answer |",
        "|---|---:|---|---|---:|---:|---:|---:|",
    ]
    for ds, idx in groups.items():
        for tag, name in stages:
            f = aggregate([read_score(scores[tag][i]) for i in idx])
            lines.append(
                f"| {ds} | {len(idx)} | {name} | {f['em']:.3f} ({f['em_se']:.3f}) | {f['f1']:.3f} | {f['cem']:.3f} | "
                f"{f.get('format_ok', 0.0):.3f} | {f.get('searches', 0.0):.2f} |"
            )
    have = {tag for tag, _ in stages}
    pairs = [(a, b, name) for a, b, name in COMPARISONS if a in have and b in have]
    if pairs:
        lines += ["", "| dataset | n | " + " | ".join(f"{name}: EM (paired s.e.)" for _, _, name in pairs) + " |"]
        lines.append("|---|---:|" + "---|" * len(pairs))
        for ds, idx in groups.items():
            cells = []
            for a, b, _ in pairs:
                d, se = paired_difference(_ems(scores[a], idx), _ems(scores[b], idx))
                z = f", {d / se:+.1f} s.e." if se > 0 else ""
                cells.append(f"{d:+.3f} ({se:.3f}{z})")
            lines.append(f"| {ds} | {len(idx)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
