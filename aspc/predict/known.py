"""Known lengths as a prediction: what ``--length-field`` compiles from."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from aspc.io.ragged import RaggedLengths
from aspc.predict.base import LengthPrediction


def prediction_from_lengths(lengths: RaggedLengths | Sequence[np.ndarray]) -> LengthPrediction:
    """Known lengths as a prediction: mean and empirical quantiles per prompt.

    One kernel over the ragged segments; each value is bit-identical to
    ``x.mean()`` and ``np.quantile(x, [0.1, 0.5, 0.9])`` of that prompt.
    """
    if not isinstance(lengths, RaggedLengths):
        lengths = RaggedLengths.from_arrays(lengths)
    mean, qs = lengths.stats([0.1, 0.5, 0.9])
    return LengthPrediction(mean=mean, q10=qs[:, 0], q50=qs[:, 1], q90=qs[:, 2])
