"""What a step costs at each training size, on this device: the budget run's side of coarse to fine.

The plan (training/coarse_to_fine.py) divides a budget between sizes by what a step costs at
each, and that depends on the device: on a CPU it follows the pixels, on a GPU a small image
costs about as much as a large one. So before the first step the trainer times one step's
render, loss and backward at the start size and at a middle one (the geometric mean of the
start factor and 1: a full-size step on a CPU costs seconds, a twentieth of a budget), and this
model fits

    seconds per step = fixed + per_pixel x pixels rendered

through the two (the pixels rendered are the sampled tiles' share of the image, which the
tile sampler lowers later in the run). The model's view of a size is then corrected by what
the steps really cost: after each size, its measured pace over its prediction scales every
later prediction (the optimizer, density control and a model that grows are in the pace, not
in the two timings), and the rest of the budget is planned again.
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence

from turbogs.training.coarse_to_fine import CoarseToFineConfig, Stage, budget_plan, downscaled_size, merge_costly

MAX_CORRECTION = 20.0  # a measured pace over the prediction is trusted within this factor either way


def fastest_in_rounds(time_once: Callable[[int], float], factors: Sequence[int], min_rounds: int = 3,
                      max_rounds: int = 20, seconds: float = 0.2) -> Dict[int, float]:
    """The fastest of several timings `time_once(factor)` of each factor, taken in rounds of one
    each: at least `min_rounds`, and as many more as fit in `seconds` (up to `max_rounds`; the
    first pays for allocations, and a cheap step needs many tries to find one nothing slowed).
    Why rounds: a busy machine (another process, another rank still loading) slows a stretch of
    time, not a size. Timed one size after the other, such a stretch can cover every try of the
    small size and none of the large one's, and the plan reads a step that costs the same at
    every size; in rounds both sizes share the stretch, and their ratio, which the plan uses, holds."""
    times: Dict[int, List[float]] = {factor: [] for factor in factors}
    spent, rounds = 0.0, 0
    while rounds < min_rounds or (spent < seconds and rounds < max_rounds):
        for factor in factors:
            times[factor].append(time_once(factor))
            spent += times[factor][-1]
        rounds += 1
    return {factor: min(taken) for factor, taken in times.items()}


class StepCosts:
    """`measure(factors) -> {factor: seconds}` for one render, loss and backward at each size
    (all tiles); `tile_share(progress)` the share of the tiles a step renders at that progress."""

    def __init__(self, width: int, height: int, measure: Callable[[Sequence[int]], Dict[int, float]],
                 start_factor: int, tile_share: Callable[[float], float]):
        self.width, self.height, self.tile_share = width, height, tile_share
        factors = sorted({start_factor, max(1, round(start_factor ** 0.5))}, reverse=True)  # coarsest first
        self.measured = measure(factors)
        small_factor, large_factor = factors[0], factors[-1]
        small_seconds, large_seconds = self.measured[small_factor], self.measured[large_factor]
        small, large = self.pixels(small_factor), self.pixels(large_factor)
        self.per_pixel = max((large_seconds - small_seconds) / (large - small), 0.0) if large > small else 0.0
        self.fixed = max(small_seconds - self.per_pixel * small, 0.0)
        self.correction = 1.0

    def pixels(self, factor: int) -> int:
        width, height = downscaled_size(self.width, self.height, factor)
        return width * height

    def predict(self, factor: int, progress: float) -> float:
        """Seconds a step at this size is expected to cost at this progress (in [0, 1])."""
        model = self.fixed + self.per_pixel * self.pixels(factor) * self.tile_share(progress)
        return max(model * self.correction, 1e-9)

    def observe(self, factor: int, progress: float, pace: Optional[float]) -> None:
        """A size's measured seconds per step (at the progress it ended), which corrects the model."""
        if pace:
            model = self.predict(factor, progress) / self.correction
            self.correction = min(max(pace / model, 1.0 / MAX_CORRECTION), MAX_CORRECTION)

    def plan(self, stages: Sequence[Stage], progress: float, seconds_left: float, steps_left: float,
             config: CoarseToFineConfig) -> List[Stage]:
        """The stages from the current one on, with their seconds of the `seconds_left`: the costs
        predicted at each stage's middle (the progress it will be at), sizes not cheap enough to be
        worth a stage merged into the next, then the time split (coarse_to_fine.budget_plan)."""
        middles, start = [], progress
        for stage in stages:
            middles.append(start + stage.carries / 2)
            start += stage.carries
        costs = [self.predict(stage.factor, middle) for stage, middle in zip(stages, middles)]
        kept = merge_costly(list(stages), costs, config.min_speedup)
        return budget_plan(kept, [stage.step_seconds for stage in kept], seconds_left, max(steps_left, 1.0),
                           config.lowest_tilt)

    def summary(self) -> str:
        """The timings, for the log."""
        parts = [f"{seconds * 1e3:.0f} ms at {'full size' if factor == 1 else f'1/{factor}'}"
                 for factor, seconds in sorted(self.measured.items())]
        return "a step measured " + ", ".join(parts)
