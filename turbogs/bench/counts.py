"""The Gaussian count over a bench run, and what each densification did.

What density control does is half of what a preset is, and the count at the evaluation
points alone hides it: a burst of growth and the pruning after it fall between two points.
The trainer reports density control's stats every step through its StepObserver seam
(training/observer.py), the same seam the step audit uses, so the bench watches there instead
of wrapping the trainer's or a strategy's methods. The stats hold host numbers already (a
strategy reads its counts once, when it densifies): reading them costs the step nothing.
"""

from __future__ import annotations

from typing import List, Optional

from turbogs.training.observer import StepObserver


class GaussianCounts(StepObserver):
    """Install as `trainer.observer`; call `after_step(trainer.step, trainer.elapsed)` after each
    `timed_step()`. `events` holds the start and every step that densified or changed the count:
    step, training seconds, the count after it and the strategy's own n_* counts (cloned, split,
    pruned, relocated...); `peak` is the largest count reported."""

    def __init__(self, start_count: int):
        self.peak = start_count
        self.events: List[dict] = [{"step": 0, "seconds": 0.0, "num_gaussians": start_count}]
        self._latest: Optional[dict] = None

    def density(self, stats: dict) -> None:
        self._latest = stats
        if stats.get("n_gaussians") is not None:
            self.peak = max(self.peak, int(stats["n_gaussians"]))

    def after_step(self, step: int, seconds: float) -> None:
        stats, self._latest = self._latest, None
        if not stats or stats.get("n_gaussians") is None:
            return
        count = int(stats["n_gaussians"])
        if not stats.get("densified") and count == self.events[-1]["num_gaussians"]:
            return
        event = {"step": step, "seconds": round(seconds, 4), "num_gaussians": count}
        event.update({key: int(value) for key, value in stats.items()
                      if key.startswith("n_") and key != "n_gaussians" and isinstance(value, (int, float))})
        self.events.append(event)
