"""Whether an accuracy reaches a threshold, decided on counts of correct examples.

A task's accuracy is a float32 mean of right/wrong answers, so 977 right of 1,000 is stored as 0.97699999809 and
1,425 of 1,500 as 0.94999998808: compared with the float64 thresholds 0.977 and 0.95 they read as below, although
the runs are exactly at them. Here the accuracy is turned back into the number of examples it counts,
``round(accuracy * examples)`` (exact while ``examples`` < 2**23, as float32 keeps 24 bits), and compared in
integers with the threshold read as the decimal it is written as (``0.977`` is 977/1000, not its binary
approximation): ``correct / examples >= threshold`` exactly. Used by ``interp table`` (Table 1's shares, the
differences of ``--compare``) and by the halving trigger of both trainers.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .errors import ConfigError


def as_fraction(threshold: float) -> Fraction:
    """``threshold`` as the decimal it prints as (``0.977`` -> 977/1000), or a ConfigError for a non-number."""
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not math.isfinite(threshold):
        raise ConfigError(f"a threshold must be a finite number, got {threshold!r}")
    return Fraction(repr(float(threshold)))


def correct_count(accuracy: float, examples: int) -> int:
    """The number of right answers among ``examples`` that ``accuracy`` (their float32 or float64 mean) stands for."""
    if isinstance(examples, bool) or not isinstance(examples, (int, np.integer)) or examples < 1:
        raise ConfigError(f"examples must be a positive integer, got {examples!r}")
    return round(float(accuracy) * int(examples))


def reaches(accuracy: float, threshold: float, examples: int | None) -> bool:
    """Whether ``accuracy`` of ``examples`` examples reaches ``threshold``: ``correct / examples >= threshold`` in
    integers (module doc). Where the number of examples is unknown (None), the accuracy and the threshold are both
    rounded to float32, the precision the accuracy was computed in: the same answer whenever the split holds fewer
    than about a million examples."""
    if accuracy is None or (isinstance(accuracy, float) and math.isnan(accuracy)):
        return False
    if examples is None:
        return bool(np.float32(accuracy) >= np.float32(threshold))
    return Fraction(correct_count(accuracy, examples), int(examples)) >= as_fraction(threshold)
