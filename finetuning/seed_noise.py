"""Is a difference between two models' seed-averaged scores larger than fine-tuning seed noise?

Each model's score on a task is the mean over its fine-tuning seeds; seeds change the classifier's
initialization, the data order and dropout, and on small dev sets they move a score by a few points.
The difference of two such means has the standard error sqrt(s_a² / n_a + s_b² / n_b) (s: the
standard deviation over seeds, n: the seeds). A difference counts as real when it exceeds that
standard error times Student's t at 95% two-sided, with Welch's degrees of freedom rounded down
(conservative for the 2–5 seeds a scorecard has): "ahead" or "behind", otherwise "level".
With a single seed on either side there is no noise estimate: the verdict is the sign alone, and
the scorecard says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Student's t, 95% two-sided, for 1..30 degrees of freedom; above 30 the value at 30 (conservative).
T_95_TWO_SIDED = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


@dataclass(frozen=True)
class SeedNoise:
    standard_error: float  # of the difference of the two seed means
    margin: float  # standard error × t(95%, Welch df): the smallest difference that counts


def t_95(degrees_of_freedom: float) -> float:
    # Welch's df is a whole number when one side's seeds agree (n - 1) or both sides' stds and seeds
    # do (2n - 2), and in floats it comes out a hair below it (1.9999999999999996): not rounded down
    df = max(1, int(math.floor(degrees_of_freedom + 1e-9)))
    return T_95_TWO_SIDED[min(df, len(T_95_TWO_SIDED)) - 1]


def difference_noise(std_a: float | None, n_a: int, std_b: float | None, n_b: int) -> SeedNoise | None:
    """The noise on mean(a) − mean(b); None without two seeds on each side or a finite std (a NaN
    metric of a diverged unit makes its side's std NaN: no noise estimate, as with one seed)."""
    if std_a is None or std_b is None or not math.isfinite(std_a + std_b) or n_a < 2 or n_b < 2:
        return None
    var_a, var_b = std_a**2 / n_a, std_b**2 / n_b
    se = math.sqrt(var_a + var_b)
    if se == 0.0:
        return SeedNoise(0.0, 0.0)
    df = se**4 / (var_a**2 / (n_a - 1) + var_b**2 / (n_b - 1))
    return SeedNoise(se, se * t_95(df))


def verdict(delta: float | None, noise: SeedNoise | None) -> str:
    """'ahead', 'behind' or 'level' (undefined deltas are level); without a noise estimate, the sign."""
    if delta is None or not math.isfinite(delta):
        return "level"
    margin = noise.margin if noise is not None else 0.0
    if delta > margin:
        return "ahead"
    if delta < -margin:
        return "behind"
    return "level"
