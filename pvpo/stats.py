"""Means and standard errors of per-question scores, the one definition every report uses
(held-out evaluation during training, `pvpo eval`, the demo's learning check, the benchmarks).

The standard error of a mean of n scores is the sample standard deviation (n - 1) over sqrt(n);
for 0/1 scores (EM) that is sqrt(p (1 - p) / (n - 1)). A paired comparison of two evaluations on
the same questions uses the per-question differences, whose standard error is much smaller than
the unpaired sqrt(se_a^2 + se_b^2) when the two runs agree on most questions.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean(values: Sequence[float]) -> float:
    """The mean of `values`; NaN for none (an average of nothing is not 0)."""
    return sum(values) / len(values) if values else float("nan")


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean of `values` (module docstring); 0 for fewer than two."""
    n = len(values)
    if n < 2:
        return 0.0
    m = sum(values) / n
    return math.sqrt(sum((x - m) ** 2 for x in values) / (n - 1) / n)


def paired_difference(before: Sequence[float], after: Sequence[float]) -> tuple[float, float]:
    """(mean of after_i - before_i, its standard error) over the same questions in the same order."""
    if len(before) != len(after):
        raise ValueError(f"a paired comparison needs the same questions: {len(before)} vs {len(after)} scores")
    d = [b - a for a, b in zip(before, after, strict=True)]
    return (sum(d) / len(d) if d else 0.0), standard_error(d)


def seeds_difference(before: Sequence[float], afters: Sequence[Sequence[float]]) -> dict[str, float]:
    """RL over one starting point, several seeds, the same questions: `before` each question's score
    at the start, `afters[s]` each question's score after seed s. Returns the mean over seeds of the
    per-seed paired differences (`mean`), and its standard error counting both sources of noise
    (`se`): sqrt(se_q^2 + sd_s^2 / S), where se_q is the paired standard error over questions of the
    seed-averaged differences (mean_s after_sq - before_q) and sd_s the sample standard deviation of
    the S per-seed mean differences (the seeds' spread, a random effect crossed with the questions');
    also `se_questions`, `sd_seeds` and `seeds`. The start's own randomness (one warm start for every
    seed) is not sampled."""
    if not afters:
        raise ValueError("seeds_difference needs at least one seed's scores")
    n = len(before)
    if any(len(a) != n for a in afters):
        raise ValueError(f"a paired comparison needs the same questions: {n} vs {[len(a) for a in afters]} scores")
    s = len(afters)
    per_seed = [paired_difference(before, a)[0] for a in afters]
    averaged = [sum(a[i] for a in afters) / s for i in range(n)]
    d, se_q = paired_difference(before, averaged)
    m = sum(per_seed) / s
    sd_s = math.sqrt(sum((x - m) ** 2 for x in per_seed) / (s - 1)) if s > 1 else 0.0
    return {
        "mean": d,
        "se": math.sqrt(se_q**2 + sd_s**2 / s),
        "se_questions": se_q,
        "sd_seeds": sd_s,
        "seeds": float(s),
    }


def seeds_contrast(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> dict[str, float]:
    """Setting A against setting B, each trained with several seeds and evaluated on the same
    questions: `a[s]` / `b[s]` each question's score after seed s. Returns the difference of the
    means over seeds (`mean`, A - B) and its standard error counting both sources of noise
    (`se`): sqrt(se_q^2 + sd_a^2 / S_a + sd_b^2 / S_b), where se_q is the paired standard error
    over questions of the seed-averaged differences and sd_a, sd_b the sample standard deviations
    of each setting's per-seed means (as `seeds_difference`, for two trained settings instead of one
    fixed start); also `se_questions`, `sd_a`, `sd_b`."""
    if not a or not b:
        raise ValueError("seeds_contrast needs at least one seed's scores on each side")
    n = len(a[0])
    if any(len(x) != n for x in (*a, *b)):
        raise ValueError(f"a paired comparison needs the same questions: {[len(x) for x in (*a, *b)]} scores")
    avg_a = [sum(x[i] for x in a) / len(a) for i in range(n)]
    avg_b = [sum(x[i] for x in b) / len(b) for i in range(n)]
    d, se_q = paired_difference(avg_b, avg_a)

    def spread(side: Sequence[Sequence[float]]) -> float:
        means = [mean(x) for x in side]
        m = sum(means) / len(means)
        return math.sqrt(sum((x - m) ** 2 for x in means) / (len(means) - 1)) if len(means) > 1 else 0.0

    sd_a, sd_b = spread(a), spread(b)
    return {
        "mean": d,
        "se": math.sqrt(se_q**2 + sd_a**2 / len(a) + sd_b**2 / len(b)),
        "se_questions": se_q,
        "sd_a": sd_a,
        "sd_b": sd_b,
    }
