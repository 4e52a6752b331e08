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
    peak_gaussians: int = 0  # the most Gaussians density control reported (results.json)
    bad_streak: int = 0  # non-finite steps in a row, as of the last refresh

    def __post_init__(self):
        self._smoothed: Optional[torch.Tensor] = None  # [2] on the device: loss, PSNR
        # 0-d on the device: steps skipped since the last read, the current streak of them, the
        # longest streak since the last read (three 0-d tensors: no stack and unbind per step)
        self._skipped = self._streak = self._longest = None

    def update(self, loss: torch.Tensor, psnr: torch.Tensor, density: Optional[dict] = None,
               ok: Optional[torch.Tensor] = None) -> None:
        """Fold in a step; `ok` (a device bool) False marks it skipped: it counts, and changes no
        figure. A NaN `psnr` (no pixel both rendered and inside the mask) leaves the PSNR as it was.
        Every step runs this, so it is written in few ops (12)."""
        latest = torch.stack([loss, psnr]).float()  # both 0-d: one stack
        if latest.requires_grad:
            latest = latest.detach()
        if self._smoothed is None:
            started = self.loss != 0.0  # resumed: continue from the checkpoint's figures
            self._smoothed = latest.new_tensor([self.loss, self.psnr]) if started else latest
            self._skipped = latest.new_zeros(())
            self._streak, self._longest = latest.new_tensor(self.bad_streak), latest.new_tensor(self.bad_streak)
        ignore = torch.isnan(latest)  # a figure with no value this step
        if ok is not None:
            not_ok = ~ok
            ignore.logical_or_(not_ok)
            bad = not_ok.to(latest.dtype)
            self._skipped = self._skipped + bad
            self._streak = torch.addcmul(bad, self._streak, bad)  # (streak + 1) * bad
            self._longest = torch.maximum(self._longest, self._streak)
        start = torch.where(torch.isnan(self._smoothed), latest, self._smoothed)  # a figure's first value
        self._smoothed = torch.where(ignore, self._smoothed, torch.lerp(start, latest, 0.1))
        density = density or {}
        self.grown += int(density.get("n_cloned", 0)) + int(density.get("n_split", 0))
        self.pruned += int(density.get("n_pruned", 0))
        if density.get("budget") is not None:
            self.budget = int(density["budget"])
        if density.get("n_gaussians") is not None:
            self.peak_gaussians = max(self.peak_gaussians, int(density["n_gaussians"]))

    def refresh(self) -> int:
        """Read the device's figures (one read); returns the longest run of skipped steps
        since the last refresh, so that the trainer can stop a diverged run."""
        if self._smoothed is None:
            return self.bad_streak
        counts = torch.stack([self._skipped, self._streak, self._longest])
        loss, psnr, skipped, streak, longest = host_read.values(torch.cat([self._smoothed, counts]))
        self.loss, self.psnr = loss, psnr
        self.skipped_steps += int(skipped)
        self.bad_streak = int(streak)
        self._skipped = self._skipped.new_zeros(())
        self._longest = self._longest.new_tensor(streak)
        return int(longest)

    def state_dict(self) -> dict:
        self.refresh()
        return {name: getattr(self, name)
                for name in ("loss", "psnr", "skipped_steps", "grown", "pruned", "budget", "bad_streak")}

    def density_figures(self) -> dict:
        figures = {"grown": self.grown, "pruned": self.pruned}
        return figures if self.budget is None else {**figures, "budget": self.budget}
