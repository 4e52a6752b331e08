"""The progress bar's and the viewer's figures, kept so that a training step never waits for
the host: smoothed loss and PSNR and the skipped-step count live on the device and are read
in one go at a refresh; density control's counts (plain ints the strategy returns) beside them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from turbogs import host_read


@dataclass
class RunningStats:
    """Figures for the progress bar and the viewer: smoothed loss and PSNR, and what density
    control did over the run (from the stats its after_backward returns).

    The smoothed loss and PSNR, and the count of skipped (non-finite) steps, stay on the device:
    `update` takes tensors and reads nothing, so a step never waits for the host. `refresh()`
    reads them all at once, which the trainer does only when the bar, the viewer or a
    checkpoint shows them."""

    loss: float = 0.0
    psnr: float = 0.0
    skipped_steps: int = 0
    grown: int = 0  # Gaussians cloned or split
    pruned: int = 0
    budget: Optional[int] = None  # the strategy's current cap on the count, when it has one
    bad_streak: int = 0  # non-finite steps in a row, as of the last refresh

    def __post_init__(self):
        self._smoothed: Optional[torch.Tensor] = None  # [2] on the device: loss, PSNR
        # [3] on the device: steps skipped since the last read, the current streak, the longest since the last read
        self._bad: Optional[torch.Tensor] = None

    def update(self, loss: torch.Tensor, psnr: torch.Tensor, density: Optional[dict] = None,
               ok: Optional[torch.Tensor] = None) -> None:
        """Fold in a step; `ok` (a device bool) False marks it skipped: it counts, and changes no
        figure. A NaN `psnr` (no pixel both rendered and inside the mask) leaves the PSNR as it was."""
        latest = torch.stack([loss, psnr]).detach().float()  # both 0-d: one stack, few ops per step
        if self._smoothed is None:
            started = self.loss != 0.0  # resumed: continue from the checkpoint's figures
            self._smoothed = latest.new_tensor([self.loss, self.psnr]) if started else latest
            self._bad = latest.new_tensor([0.0, self.bad_streak, self.bad_streak])
        smoothed = torch.lerp(self._smoothed, latest, 0.1)
        smoothed = torch.where(torch.isnan(self._smoothed), latest, smoothed)  # a figure's first value
        not_ok = None if ok is None else ~ok
        keep = torch.isnan(latest) if ok is None else torch.isnan(latest) | not_ok
        self._smoothed = torch.where(keep, self._smoothed, smoothed)
        if ok is not None:
            bad = not_ok.to(latest.dtype)
            skipped, streak, longest = self._bad.unbind(0)
            streak = (streak + 1) * bad
            self._bad = torch.stack([skipped + bad, streak, torch.maximum(longest, streak)])
        density = density or {}
        self.grown += int(density.get("n_cloned", 0)) + int(density.get("n_split", 0))
        self.pruned += int(density.get("n_pruned", 0))
        if density.get("budget") is not None:
            self.budget = int(density["budget"])

    def refresh(self) -> int:
        """Read the device's figures (one read); returns the longest run of skipped steps
        since the last refresh, so that the trainer can stop a diverged run."""
        if self._smoothed is None:
            return self.bad_streak
        loss, psnr, skipped, streak, longest = host_read.values(torch.cat([self._smoothed, self._bad]))
        self.loss, self.psnr = loss, psnr
        self.skipped_steps += int(skipped)
        self.bad_streak = int(streak)
        self._bad = self._bad.new_tensor([0.0, streak, streak])
        return int(longest)

    def state_dict(self) -> dict:
        self.refresh()
        return {name: getattr(self, name)
                for name in ("loss", "psnr", "skipped_steps", "grown", "pruned", "budget", "bad_streak")}

    def density_figures(self) -> dict:
        figures = {"grown": self.grown, "pruned": self.pruned}
        return figures if self.budget is None else {**figures, "budget": self.budget}
