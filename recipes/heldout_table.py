"""The held-out table of a run, per dataset and overall: EM (with its standard error), F1, CEM,
format rate and searches of each evaluated policy (the base model, after the warm start, after RL),
and the paired differences between them on the same questions (`pvpo.stats`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pvpo.stats import mean, paired_difference, standard_error

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


def _col(scores: Scores, idx: Sequence[int], key: str) -> list[float]:
    return [float(scores[i].get(key, 0.0)) for i in idx]


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
            s = scores[tag]
            em = _col(s, idx, "em")
            lines.append(
                f"| {ds} | {len(idx)} | {name} | {mean(em):.3f} ({standard_error(em):.3f}) | "
                f"{mean(_col(s, idx, 'f1')):.3f} | {mean(_col(s, idx, 'cem')):.3f} | "
                f"{mean(_col(s, idx, 'format_ok')):.3f} | {mean(_col(s, idx, 'searches')):.2f} |"
            )
    have = {tag for tag, _ in stages}
    pairs = [(a, b, name) for a, b, name in COMPARISONS if a in have and b in have]
    if pairs:
        lines += ["", "| dataset | n | " + " | ".join(f"{name}: EM (paired s.e.)" for _, _, name in pairs) + " |"]
        lines.append("|---|---:|" + "---|" * len(pairs))
        for ds, idx in groups.items():
            cells = []
            for a, b, _ in pairs:
                d, se = paired_difference(_col(scores[a], idx, "em"), _col(scores[b], idx, "em"))
                z = f", {d / se:+.1f} s.e." if se > 0 else ""
                cells.append(f"{d:+.3f} ({se:.3f}{z})")
            lines.append(f"| {ds} | {len(idx)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
