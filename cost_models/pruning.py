"""Pruning report: how much of a space the model would keep, and how much of the true best it keeps.

Recall cannot be measured on the task being tuned (nothing is measured yet), so it is estimated on
held-out tasks: pairs (true values, model scores) for tasks the model did not see while it scored them
(leave one task out over the prior). The keep share is the smallest one on a fixed grid whose mean
estimated recall of the best 1% reaches `target_recall`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .metrics import kept_count, top_k_recall

__all__ = ["PruningReport", "pruning_report", "KEEP_GRID"]

KEEP_GRID = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0)


@dataclass(frozen=True)
class PruningReport:
    space_size: int
    keep_share: float
    kept: int
    estimated_recall: float | None  # of the true best `best` share; None = no held-out task to estimate it
    best: float
    basis: str
    recall_by_share: dict[float, float]

    def __str__(self) -> str:
        rec = "unknown" if self.estimated_recall is None else f"{self.estimated_recall:.2f}"
        return (
            f"keep {self.kept} of {self.space_size} configs ({self.keep_share:.0%}); estimated recall of the "
            f"best {self.best:.0%}: {rec} ({self.basis})"
        )


def pruning_report(
    space_size: int,
    validation: Sequence[tuple[Sequence[float], Sequence[float]]] = (),
    *,
    keep: float | None = None,
    best: float = 0.01,
    target_recall: float = 0.9,
) -> PruningReport:
    """`validation`: (true values, model scores) of held-out tasks. `keep`: a fixed share, or None to
    choose the smallest share on KEEP_GRID whose mean recall reaches `target_recall`."""
    if space_size < 1:
        raise ValueError(f"space_size must be >= 1, got {space_size}")
    by_share: dict[float, float] = {}
    if validation:
        for share in KEEP_GRID:
            by_share[share] = float(
                np.mean([top_k_recall(t, s, keep=share, best=best) for t, s in validation])
            )
    if keep is None:
        if not by_share:
            return PruningReport(
                space_size, 1.0, space_size, None, best, "no held-out task: nothing pruned", {}
            )
        keep = next((s for s in KEEP_GRID if by_share[s] >= target_recall), 1.0)
    if by_share and keep not in by_share:
        by_share[keep] = float(np.mean([top_k_recall(t, s, keep=keep, best=best) for t, s in validation]))
    rec = by_share.get(keep) if by_share else None
    basis = f"leave one task out over {len(validation)} prior tasks" if validation else "no held-out task"
    return PruningReport(space_size, float(keep), kept_count(space_size, keep), rec, best, basis, by_share)
