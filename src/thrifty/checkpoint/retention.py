"""Which checkpoints to keep: the newest `keep_last`, plus the best by metric if asked."""

from __future__ import annotations

from collections.abc import Mapping


def checkpoints_to_keep(
    published: Mapping[int, float | None], *, keep_last: int, keep_best: bool
) -> set[int]:
    """Steps to keep among `published` (step -> metric, lower is better; None is unranked).

    The newest checkpoints are always kept, so whatever is dropped has `keep_last` newer ones
    published beside it. Ties on the metric keep the newer step.
    """
    steps = sorted(published)
    keep = set(steps[-keep_last:]) if keep_last > 0 else set()
    if keep_best:
        ranked = [(metric, -step) for step, metric in published.items() if metric is not None]
        if ranked:
            keep.add(-min(ranked)[1])
    return keep
