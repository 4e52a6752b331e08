"""Coarse to fine while the run goes: which training size it is at, the views of that size, and
a budget run's plan of its sizes (training/coarse_to_fine.py says why and how they are chosen).

The trainer asks two things of it, at the start of a step: a budget run's first step has its
sizes planned (`plan_budget`: a step timed at the start size and a middle one), and a size
that has had its time or its steps gives way to the next (`next_size`, which plans the rest of
the budget again with the costs measured so far). Each answers the factor to train at; the
trainer then switches its views, error memory and render mode (`Trainer.use_size`).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from turbogs.training.coarse_to_fine import Stage, describe, downscaled_size, plan_stages
from turbogs.training.config import TrainConfig
from turbogs.training.progress import WorkProgress
from turbogs.training.step_costs import StepCosts
from turbogs.training.views import TrainingViews


def run_stages(cfg: TrainConfig, full_views: TrainingViews) -> List[Stage]:
    """The run's sizes and their shares of the work, from the training images at full size."""
    cameras = full_views.cameras
    short_side = min(min(c.width, c.height) for c in cameras)
    return plan_stages(full_views.images, cameras[0].width, cameras[0].height, cfg.coarse_to_fine,
                       short_side=short_side)


class TrainingSizes:
    def __init__(self, cfg: TrainConfig, full_views: TrainingViews, progress: WorkProgress):
        self.cfg, self.full_views, self.progress = cfg, full_views, progress
        self.step_costs: Optional[StepCosts] = None  # a budget run's, measured at its first step
        camera = full_views.cameras[0]
        self.width, self.height = camera.width, camera.height

    def views(self, factor: int) -> TrainingViews:
        """The training views downscaled by `factor` (made anew: only the current size is kept)."""
        if factor == 1:
            return self.full_views
        return self.full_views.resized([downscaled_size(c.width, c.height, factor) for c in self.full_views.cameras])

    def describe(self) -> str:
        return describe(self.progress.stages, self.width, self.height)

    def first_line(self) -> str:
        """What the log says first: the sizes and why they start where they do."""
        config = self.cfg.coarse_to_fine
        if len(self.progress.stages) == 1:
            short_side = min(min(c.width, c.height) for c in self.full_views.cameras)
            return (f"coarse to fine: every step at full size, as the images are small (short side {short_side} px; "
                    f"a smaller size would be under {config.min_side} px)")
        timing = ", its time planned at the first step" if self.cfg.budget_seconds else " (by steps)"
        return (f"coarse to fine: {self.describe()}; the start keeps {config.start_energy:.0%} of the photos' "
                f"spectrum{timing}")

    @property
    def needs_plan(self) -> bool:
        """A budget run of several sizes whose time is not split yet."""
        return self.step_costs is None and bool(self.cfg.budget_seconds) and len(self.progress.stages) > 1

    def plan_budget(self, time_steps: Callable[[Sequence[int]], Dict[int, float]], step: int, elapsed: float) -> int:
        """Time a step at the current (start) size and a middle one (`time_steps(factors)`), split
        the budget left between the sizes, and return the factor to train at (the plan may merge
        the start size into the next)."""
        sampler = self.cfg.sampler if self.cfg.error_guided else None
        tile_share = sampler.fraction_at if sampler is not None else (lambda progress: 1.0)
        self.step_costs = StepCosts(self.width, self.height, time_steps, self.progress.stage.factor, tile_share)
        return self._replan(step, elapsed)

    def next_size(self, step: int, elapsed: float, progress: float) -> int:
        """Move on to the next size; a budget run's costs corrected by the size done, and the rest
        of its budget planned again. Returns the factor to train at."""
        if self.step_costs is not None:
            self.step_costs.observe(self.progress.stage.factor, progress, self.progress.seconds_per_step)
        self.progress.next_stage(step, elapsed)
        return self._replan(step, elapsed) if self.step_costs is not None else self.progress.stage.factor

    def _replan(self, step: int, elapsed: float) -> int:
        config, progress = self.cfg.coarse_to_fine, self.progress
        stages = progress.stages[progress.index:]
        progress.plan(self.step_costs.plan(stages, progress.share_before(), self.cfg.budget_seconds - elapsed,
                                           config.target_steps - step, config))
        return progress.stage.factor

    def summary(self) -> str:
        """The measured costs and the plan, for the log."""
        return f"coarse to fine, {self.step_costs.summary()}: {self.describe()}"
