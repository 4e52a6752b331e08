"""How far a run is: the fraction of its work done, which every schedule follows.

A run of S steps is `step / S` done. A run with a time budget of B seconds ends when B
seconds of training have passed, but its schedules (the position learning rate's decay, the
densification window, SH growth, the tile fraction) must not follow the seconds: the
seconds a step costs change tenfold within a run. A capture without points starts from many
Gaussians that density control prunes early, a viewer or an evaluation pause slows steps
down, a grown model slows them again. Scheduled by seconds, the few slow early steps would
use up the warm-up and the densification window, and most steps would run at the tail of
the decay.

So a budget run counts its progress in steps, against the number of steps it will have
made when the budget runs out, projected from its recent pace:

    progress = step / (step + seconds left x steps per second lately)

With a steady pace this is exactly the elapsed fraction of the budget. When steps get
faster, the projected total grows and progress waits (it never goes back) until the steps
catch up; when they get slower, progress moves on faster, so the schedules still end with
the budget. At the end of the budget the projection is the steps made: progress is 1.
"""

from __future__ import annotations

from typing import Optional

PACE_SMOOTHING = 0.05  # weight of the newest step in the running seconds-per-step average


class RunProgress:
    """`at(step, elapsed)`: the run's progress in [0, 1] after `step` steps and `elapsed`
    training seconds. Call it with non-decreasing figures (every rank with the same ones:
    its state then stays the same on every rank); it learns the pace from them."""

    def __init__(self, steps: int, budget_seconds: Optional[float] = None):
        self.steps, self.budget = max(int(steps), 1), budget_seconds
        self.done = 0.0  # the largest progress reported: progress never goes back
        self.seconds_per_step: Optional[float] = None  # the recent pace
        self._last = (0, 0.0)  # the (step, elapsed) the pace was last updated with

    def at(self, step: int, elapsed: float) -> float:
        by_steps = step / self.steps
        if not self.budget:
            return min(by_steps, 1.0)
        if elapsed >= self.budget or by_steps >= 1.0:
            return 1.0
        self._learn_pace(step, elapsed)
        if self.seconds_per_step:
            projected = step + (self.budget - elapsed) / self.seconds_per_step
            self.done = max(self.done, step / projected, by_steps)
        return min(self.done, 1.0)

    def _learn_pace(self, step: int, elapsed: float) -> None:
        last_step, last_elapsed = self._last
        if step <= last_step or elapsed <= last_elapsed:
            return
        pace = (elapsed - last_elapsed) / (step - last_step)
        self._last = (step, elapsed)
        if self.seconds_per_step is None:
            self.seconds_per_step = pace
        else:
            self.seconds_per_step += PACE_SMOOTHING * (pace - self.seconds_per_step)

    def state_dict(self) -> dict:
        return {"done": self.done, "seconds_per_step": self.seconds_per_step, "last": list(self._last)}

    def load_state_dict(self, state: Optional[dict]) -> None:
        if state:
            self.done, self.seconds_per_step = state["done"], state["seconds_per_step"]
            self._last = (int(state["last"][0]), float(state["last"][1]))
