"""How many Gaussians a capture without points starts from: what its images call for, as
many as the run can afford.

INRIA starts NeRF-synthetic scenes from a flat 100k random points. On a GPU that is cheap;
on the CPU a step costs about 7.5 us per Gaussian, so 100k Gaussians make a step of 0.75 s
and a 100-second run makes 130 steps, all spent before density control has removed the
points that lie in empty space. So the count is

1. what the images call for: one Gaussian per PIXELS_PER_GAUSSIAN pixels of the training
   views, at most INRIA's 100k and at least MIN_POINTS;
2. on the CPU, with a time budget, no more than the budget affords for STEPS_WANTED steps
   at CPU_SECONDS_PER_GAUSSIAN_STEP (a GPU step costs microseconds for these counts: no cap);
3. never more than the run's Gaussian budget (--max-gaussians).

Density control grows the model from there where the error is: a start that is too small
costs a few densifications, one that is too large costs the run. `--init-points` overrides.
"""

from __future__ import annotations

from typing import Optional, Tuple

from turbogs.data.scene import Scene

INRIA_RANDOM_POINTS = 100_000  # INRIA's start for NeRF-synthetic scenes
MIN_POINTS = 2_000
PIXELS_PER_GAUSSIAN = 16  # one Gaussian per 4 x 4 pixels of the training views
# Measured on a 2-core AMD EPYC with the torch twins: 100k Gaussians, 0.75 s a step
# (a 504 x 378 capture); a step's cost is close to linear in the count.
CPU_SECONDS_PER_GAUSSIAN_STEP = 7.5e-6
STEPS_WANTED = 1000  # a budget run on the CPU should make at least this many steps


def initial_count(scene: Scene, requested: Optional[int], device_type: str, budget_seconds: Optional[float],
                  max_gaussians: Optional[int]) -> Tuple[int, str]:
    """(how many points to start from, why), for a capture without points."""
    if requested is not None:
        return requested, "as --init-points asks"
    pixels = sum(camera.width * camera.height for camera in scene.train)
    count = min(max(pixels // PIXELS_PER_GAUSSIAN, MIN_POINTS), INRIA_RANDOM_POINTS)
    why = f"one per {PIXELS_PER_GAUSSIAN} of the training views' {pixels / 1e6:.2g} M pixels"
    if count == INRIA_RANDOM_POINTS:
        why += f", at most INRIA's {INRIA_RANDOM_POINTS // 1000}k"
    if device_type == "cpu" and budget_seconds:
        affordable = int(budget_seconds / (STEPS_WANTED * CPU_SECONDS_PER_GAUSSIAN_STEP))
        if affordable < count:
            count = max(affordable, MIN_POINTS)
            why = (f"what a {budget_seconds:g} s budget on the CPU affords for {STEPS_WANTED} steps "
                   f"(about {CPU_SECONDS_PER_GAUSSIAN_STEP * 1e6:g} us per Gaussian a step; --init-points to choose)")
    if max_gaussians is not None and max_gaussians < count:
        count, why = max_gaussians, "the run's Gaussian budget"
    return count, why
