"""The progress bar of a training run: what a user watches while it trains.

A step run counts steps; a budget run counts seconds of the budget (the time left is the
budget's), with the steps made as a figure beside it. The figures: the smoothed loss and the
sampled pixels' PSNR, the Gaussians (with what density control grew and pruned, and its
budget), the training size while coarse to fine grows it, and any skipped steps.
"""

from __future__ import annotations

from typing import Optional

from tqdm import tqdm


def count_text(count: int) -> str:
    """A count as people read one: 950, 15.6k, 1.0M (not 1e+06)."""
    if count < 1000:
        return str(count)
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


class TrainingBar:
    def __init__(self, steps: int, budget_seconds: Optional[float], shown: bool, step: int = 0,
                 elapsed: float = 0.0):
        self.budget = budget_seconds
        if not budget_seconds:
            self.bar = tqdm(total=steps, initial=step, disable=not shown, dynamic_ncols=True, unit="step", desc="train")
        else:
            self.bar = tqdm(total=budget_seconds, initial=min(elapsed, budget_seconds), disable=not shown,
                            dynamic_ncols=True, unit="s", desc="train",
                            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s of budget "
                                       "[{remaining} left]{postfix}")

    def advance(self, elapsed: float) -> None:
        """Move the bar by the step just made: one step, or its seconds of the budget."""
        if not self.budget:
            self.bar.update(1)
        else:
            self.bar.update(min(elapsed, self.budget) - self.bar.n)

    def show(self, step: int, loss: float, psnr: float, gaussians: int, density: dict, skipped: int,
             size: Optional[str] = None) -> None:
        """The figures after `step`; `density`: grown, pruned and (when the strategy has one) budget;
        `size`: the training size while it is not the requested one yet."""
        figures = {"step": step} if self.budget else {}
        figures.update(loss=f"{loss:.4f}", psnr=f"{psnr:.2f}", gaussians=count_text(gaussians))
        if size is not None:
            figures["size"] = size
        figures.update(grown=count_text(density.get("grown", 0)), pruned=count_text(density.get("pruned", 0)))
        if density.get("budget") is not None:
            figures["budget"] = count_text(density["budget"])
        self.bar.set_postfix(**figures, skipped=skipped, refresh=False)

    def close(self) -> None:
        self.bar.close()
