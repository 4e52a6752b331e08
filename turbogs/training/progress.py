"""How far a run is: the fraction of its work done, which every schedule follows, and which
training size (coarse_to_fine.Stage) it is at.

A run of S steps is `step / S` done, and its sizes follow each other at their shares of the
work, counted in steps. In a run with a time budget each size carries the share of the progress
that its planned seconds are of the budget. A run with a time budget of B seconds ends when B seconds of training have passed, but
its schedules (the position learning rate's decay, the densification window, SH growth, the tile
fraction) must not follow the seconds: the seconds a step costs change tenfold within a run. A
capture without points starts from many Gaussians that density control prunes early, a viewer
or an evaluation pause slows steps down, a grown model slows them again, and every larger
training size costs more a step by design. Scheduled by seconds, the few slow steps would use up
the warm-up and the densification window, and most steps would run at the tail of the decay.

So a budget run counts its progress in steps, against the number of steps it will have made
when its time runs out, projected from its recent pace. Within one size that lasts T seconds,

    done fraction of the size = steps at this size / (those steps + seconds of it left x steps per second lately)

and the run's progress is the shares the sizes before carried plus this fraction of the current
size's. With one size and a steady pace this is exactly the elapsed fraction of the
budget. When steps get faster, the projected total grows and progress waits (it never goes
back) until the steps catch up; when they get slower, progress moves on faster, so the
schedules still end with the size's time. At the end of the budget progress is 1.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import List, Optional, Sequence

from turbogs.training.coarse_to_fine import Stage

PACE_SMOOTHING = 0.05  # weight of the newest step in the running seconds-per-step average


class WorkProgress:
    """`at(step, elapsed)`: the run's progress in [0, 1] after `step` steps and `elapsed`
    training seconds. Call it with non-decreasing figures (every rank with the same ones:
    its state then stays the same on every rank); it learns the pace from them.

    `stages` are the run's training sizes with their shares of the work (one stage at full
    size by default); `stage` is the current one, `stage_over` says when it is done and
    `next_stage` moves on. A budget run's stages need their seconds (`plan`) to end."""

    def __init__(self, steps: int, budget_seconds: Optional[float] = None, stages: Optional[Sequence[Stage]] = None):
        self.steps, self.budget = max(int(steps), 1), budget_seconds
        self.stages: List[Stage] = list(stages) if stages else [Stage(1, 1.0)]
        self.index = 0  # the current stage
        self.starts = [(0, 0.0)]  # the (step, elapsed) at which each stage so far began
        self.done = 0.0  # the largest progress reported: progress never goes back
        self.seconds_per_step: Optional[float] = None  # the recent pace, at this stage
        self._last = (0, 0.0)  # the (step, elapsed) the pace was last updated with

    @property
    def stage(self) -> Stage:
        return self.stages[self.index]

    @property
    def stage_start(self) -> tuple:
        """The (step, elapsed) at which the current stage began."""
        return self.starts[-1]

    @property
    def last_stage(self) -> bool:
        return self.index == len(self.stages) - 1

    def share_before(self) -> float:
        """The work of the stages done."""
        return sum(stage.carries for stage in self.stages[: self.index])

    def at(self, step: int, elapsed: float) -> float:
        by_steps = step / self.steps
        if not self.budget:
            return min(by_steps, 1.0)
        if elapsed >= self.budget or by_steps >= 1.0:
            return 1.0
        self._learn_pace(step, elapsed)
        if self.seconds_per_step:
            made = step - self.stage_start[0]
            projected = made + self._seconds_left(elapsed) / self.seconds_per_step
            within = made / projected if projected > 0 else 1.0
            self.done = max(self.done, self.share_before() + self.stage.carries * within, by_steps)
        return min(self.done, 1.0)

    def _seconds_left(self, elapsed: float) -> float:
        """Training seconds left at this stage: the budget's for the last one, else its plan's."""
        if self.last_stage or self.stage.seconds is None:
            return max(self.budget - elapsed, 0.0)
        return max(self.stage.seconds - (elapsed - self.stage_start[1]), 0.0)

    def stage_end_step(self, index: int) -> int:
        """A step run: the step at which stage `index` ends (its share of the steps, summed)."""
        return round(self.steps * sum(stage.share for stage in self.stages[: index + 1]))

    def stage_over(self, step: int, elapsed: float) -> bool:
        """Whether the current stage has had its steps (a step run) or its planned seconds (a
        budget run); the last stage lasts to the end of the run."""
        if self.last_stage:
            return False
        if not self.budget:
            return step >= self.stage_end_step(self.index)
        return self.stage.seconds is not None and elapsed - self.stage_start[1] >= self.stage.seconds

    def plan(self, stages: Sequence[Stage]) -> None:
        """The current and later stages, re-planned: their seconds of the time left, which carry
        the progress left in proportion."""
        left, seconds = 1.0 - self.share_before(), sum(stage.seconds for stage in stages)
        for stage in stages:
            stage.progress_share = left * stage.seconds / seconds if seconds > 0 else left / len(stages)
        self.stages = self.stages[: self.index] + list(stages)

    def next_stage(self, step: int, elapsed: float) -> Stage:
        """Move on to the next stage from (step, elapsed); the work of the one done is done."""
        self.done = max(self.done, self.share_before() + self.stage.carries)
        self.index += 1
        self.starts.append((step, elapsed))
        self.seconds_per_step, self._last = None, (step, elapsed)
        return self.stage

    def trained(self, step: int, elapsed: float) -> list:
        """Each size so far, the current one included: its factor, steps and training seconds."""
        ends = self.starts[1:] + [(step, elapsed)]
        return [{"factor": stage.factor, "steps": end[0] - start[0], "seconds": round(end[1] - start[1], 3)}
                for stage, start, end in zip(self.stages, self.starts, ends)]

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
        return {"done": self.done, "seconds_per_step": self.seconds_per_step, "last": list(self._last),
                "stages": [asdict(stage) for stage in self.stages], "index": self.index,
                "starts": [list(start) for start in self.starts]}

    def load_state_dict(self, state: Optional[dict]) -> None:
        if state:
            self.done, self.seconds_per_step = state["done"], state["seconds_per_step"]
            self._last = (int(state["last"][0]), float(state["last"][1]))
            if "stages" in state:
                self.stages = [Stage(**stage) for stage in state["stages"]]
                self.index = int(state["index"])
                self.starts = [(int(step), float(elapsed)) for step, elapsed in state["starts"]]
