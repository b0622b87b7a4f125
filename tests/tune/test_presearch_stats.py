"""The fit's statistics: runs.percentiles is numpy's percentile bit for bit, on the sizes and shapes a fit meets."""

import numpy as np

from chunkbench.tune.presearch.runs import STAT_PCTS, percentiles, stats


def test_percentiles_are_numpys_bit_for_bit():
    rng = np.random.default_rng(7)
    shapes = (
        lambda n: rng.lognormal(0, 2, n),  # latencies: a long tail
        lambda n: rng.integers(0, 5, n).astype(float),  # ties everywhere
        lambda n: np.round(rng.normal(50, 10, n), 3),
        lambda n: np.zeros(n),
    )
    for n in (*range(1, 130), 199, 200, 201, 999, 1000, 1001, 4097):
        for shape in shapes:
            values = shape(n)
            assert percentiles(values).tobytes() == np.percentile(values, STAT_PCTS).tobytes(), (n, values)
    assert stats([]) == {}
    assert stats([3.0, 1.0, 2.0]) == {"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98}
