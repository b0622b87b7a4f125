"""Length buckets for padded batched decode attention (torch-free: the simulator's cost model uses it too)."""

from __future__ import annotations

from collections.abc import Sequence


def length_buckets(indices: Sequence[int], lengths: Sequence[int], spread: float = 2.0) -> list[list[int]]:
    """Split indices sorted by length into runs whose longest is at most `spread` times their shortest, so
    a batch padded to its longest wastes at most half its reads (one long context must not pad all)."""
    groups: list[list[int]] = []
    for i in indices:
        if groups and lengths[i] <= spread * lengths[groups[-1][0]]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups
