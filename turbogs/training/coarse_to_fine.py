"""Coarse to fine: a plan of the training sizes, from small images to the size the model is for.

Why: at the size users train (a phone's 1080 x 1920), a step costs a hundred times one at an
eighth of it, so a budget run at full size makes too few steps to learn anything; one trained
small all the way and viewed large has no detail and aliases. So the images start small, where
steps are cheap and the coarse shape and colours are learned, and grow to the requested size,
where the detail is (DashGaussian, CVPR 2025). The plan answers three questions:

1. **Which sizes.** Integer downscale factors from a start factor down to 1 (the requested
   size). The start is the coarsest factor (at most `max_factor`, no image's short side under
   `min_side` pixels) whose images still hold `start_energy` of the photos' spectrum: the share
   of the Fourier magnitudes within the frequencies that size can show (`spectrum_energy`).
   Smooth photos start smaller than detailed ones.
2. **How much of the run's work each size is** (`work_shares`): DashGaussian's rule. The size
   reaches full at `full_size_from` of the work; before that, a size lasts in proportion to
   the log-energy the next size adds, so the run stays where growing would add little.
   The schedules that follow the run's progress (learning rate, SH, density control, the tile
   sampler) follow this work: progress is the shares of the sizes done plus the done fraction
   of the current one (training/progress.py).
3. **How long each size runs.** A run of `--steps N` gives size k `share_k x N` steps: the
   same plan, counted in steps, whatever the device. A run with a time budget also needs the
   steps to be many enough: with c_k the seconds a step costs at size k (measured on this
   device), size k gets time in proportion to share_k x c_k^beta. beta = 1 is the step plan
   above, which a GPU affords. Where it would make fewer than `target_steps` steps (a CPU, where
   a full-size step costs a second), beta is lowered, moving time to the cheap sizes, until the
   budget makes them (`budget_plan`). A size whose step is not at least `min_speedup` times
   cheaper than the next size's is not worth its own stage and joins that one.

Everything here is arithmetic on small lists; the trainer measures, switches the images and
calls `budget_plan` again at every change of size with the costs it has measured since.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

import torch
from torch import Tensor

from turbogs.errors import InputError


@dataclass
class CoarseToFineConfig:
    enabled: bool = False  # off: every step at the requested size (INRIA, the 3dgs preset)
    max_factor: int = 8  # the coarsest size: 1/8 of the requested one, as DashGaussian
    min_side: int = 64  # no size whose images' short side is under this many pixels
    start_energy: float = 0.25  # the start size keeps this share of the spectrum (DashGaussian's 1/4)
    full_size_from: float = 0.5  # the requested size from this share of the work on
    target_steps: int = 3000  # a budget run moves time to the small sizes until it makes this many steps ...
    lowest_tilt: float = -2.0  # ... but no further than time in proportion to share / cost^2 (beta -2)
    min_speedup: float = 1.5  # a size whose step is not this much cheaper than the next's joins it
    # During the small sizes render with Mip-Splatting's 2D filter and opacity compensation, so that
    # Gaussians smaller than a pixel there fade instead of surviving as needles that alias at full size.
    antialiased_small: bool = True

    def __post_init__(self):
        def check(ok: bool, what: str):
            if not ok:
                raise InputError(f"coarse-to-fine setting: {what}")

        check(self.max_factor >= 1, f"max_factor must be at least 1, got {self.max_factor}")
        check(self.min_side >= 1, f"min_side must be at least 1, got {self.min_side}")
        check(0 < self.start_energy <= 1, f"start_energy must be in (0, 1], got {self.start_energy}")
        check(0 <= self.full_size_from < 1, f"full_size_from must be in [0, 1), got {self.full_size_from}")
        check(self.target_steps >= 1, f"target_steps must be at least 1, got {self.target_steps}")
        check(self.lowest_tilt <= 1, f"lowest_tilt must be at most 1, got {self.lowest_tilt}")
        check(self.min_speedup >= 1, f"min_speedup must be at least 1, got {self.min_speedup}")


@dataclass
class Stage:
    """One size of the plan: images downscaled by `factor`, for `share` of the run's work, and
    (budget runs) `seconds` of training time at `step_seconds` a step (the prediction), which
    carry `progress_share` of the run's progress (training/progress.py)."""

    factor: int
    share: float
    seconds: Optional[float] = None
    step_seconds: Optional[float] = None
    progress_share: Optional[float] = None

    @property
    def carries(self) -> float:
        """The share of the run's progress this size carries: its planned time's share of the
        budget in a budget run, its share of the work (and steps) in a step run."""
        return self.share if self.progress_share is None else self.progress_share

    @property
    def steps(self) -> Optional[float]:
        """The steps the plan expects of this size (budget runs)."""
        if self.seconds is None or not self.step_seconds:
            return None
        return self.seconds / self.step_seconds


def downscaled_size(width: int, height: int, factor: int) -> tuple:
    """(width, height) of an image downscaled by `factor`, at least 1 x 1 (rounded, as the loader's -r)."""
    return max(1, round(width / factor)), max(1, round(height / factor))


def spectrum_energy(images: Sequence[Tensor], factors: Sequence[int]) -> List[float]:
    """For each factor f, the mean over `images` ([H, W, 3]) of the share of their Fourier
    magnitudes (grey, DC included) at frequencies an image downscaled by f can hold: |fx|, |fy|
    at most 1 / (2f) cycles per pixel. 1.0 for f = 1."""
    shares = torch.zeros(len(factors), dtype=torch.float64)
    for image in images:
        grey = image.detach().float().mean(dim=-1)
        magnitude = torch.fft.fft2(grey).abs()
        fy = torch.fft.fftfreq(grey.shape[0], device=grey.device).abs()
        fx = torch.fft.fftfreq(grey.shape[1], device=grey.device).abs()
        total = magnitude.sum().clamp_min(1e-12)
        for i, factor in enumerate(factors):
            limit = 0.5 / factor + 1e-9
            window = magnitude[fy <= limit][:, fx <= limit]
            shares[i] += float(window.sum() / total)
    return [float(s) / max(len(images), 1) for s in shares]


def start_factor(energy_of: dict, config: CoarseToFineConfig, short_side: int) -> int:
    """The coarsest factor whose images keep `start_energy` of the spectrum and a short side of at
    least `min_side` px; 1 (no coarse sizes) when none does."""
    allowed = [f for f in energy_of if f <= config.max_factor and short_side / f >= config.min_side]
    keeping = [f for f in allowed if energy_of[f] >= config.start_energy]
    return max(keeping, default=1)


def work_shares(energy_of: dict, start: int, full_size_from: float) -> List[Stage]:
    """The stages start, start - 1, ..., 1 with their shares of the work (DashGaussian's rule):
    size f_k begins at full_size_from x ln(E(f_k) / E(start)) / ln(1 / E(start)), so each size
    lasts in proportion to the log-energy the next one adds; full size holds the rest."""
    factors = list(range(start, 0, -1))
    if len(factors) == 1:
        return [Stage(1, 1.0)]
    low = math.log(max(energy_of[start], 1e-12))
    span = -low  # ln(1 / E(start)): the log-energy the run gains on the way to full size
    if span <= 1e-9:  # a spectrum with nothing above the start's frequencies: equal shares
        begins = [full_size_from * k / (len(factors) - 1) for k in range(len(factors))]
    else:
        begins = [full_size_from * (math.log(max(energy_of[f], 1e-12)) - low) / span for f in factors]
        begins[-1] = full_size_from  # E(1) = 1
    ends = begins[1:] + [1.0]
    return [Stage(f, end - begin) for f, begin, end in zip(factors, begins, ends) if end - begin > 0]


def plan_stages(images: Sequence[Tensor], width: int, height: int, config: CoarseToFineConfig,
                short_side: Optional[int] = None, sample: int = 8) -> List[Stage]:
    """The sizes and their shares of the work for these training images (a sample of at most
    `sample` of them, evenly spaced: the spectrum of a capture's photos is alike), the first
    width x height; `short_side`: the shortest side of any of them (default: the first's). One
    stage at factor 1 when coarse to fine is off or the images are too small for it."""
    if not config.enabled:
        return [Stage(1, 1.0)]
    short_side = short_side or min(width, height)
    factors = [f for f in range(1, config.max_factor + 1) if short_side / f >= config.min_side]
    if len(factors) <= 1:
        return [Stage(1, 1.0)]
    chosen = [images[round(i * (len(images) - 1) / max(sample - 1, 1))] for i in range(min(sample, len(images)))]
    energy_of = dict(zip(factors, spectrum_energy(chosen, factors)))
    return work_shares(energy_of, start_factor(energy_of, config, short_side), config.full_size_from)


# --- time: a budget run ---------------------------------------------------------------


def merge_costly(stages: List[Stage], step_seconds: Sequence[float], min_speedup: float) -> List[Stage]:
    """Stages whose predicted step is not `min_speedup` times cheaper than the next kept stage's
    give their share to that stage (from the finest backwards): a small size saves nothing
    where a step costs about the same at any size (small images on a GPU)."""
    kept, costs = [stages[-1]], [step_seconds[-1]]
    for stage, cost in zip(reversed(stages[:-1]), reversed(step_seconds[:-1])):
        if cost * min_speedup <= costs[0]:
            kept.insert(0, stage)
            costs.insert(0, cost)
        else:
            kept[0] = Stage(kept[0].factor, kept[0].share + stage.share)
    return [Stage(s.factor, s.share, step_seconds=c) for s, c in zip(kept, costs)]


def steps_made(shares: Sequence[float], costs: Sequence[float], seconds: float, beta: float) -> float:
    """The steps `seconds` make when stage k gets time in proportion to share_k x cost_k^beta."""
    weights = [s * c ** beta for s, c in zip(shares, costs)]
    total = sum(weights)
    return sum(seconds * w / total / c for w, c in zip(weights, costs)) if total > 0 else 0.0


def tilt(shares: Sequence[float], costs: Sequence[float], seconds: float, target_steps: float,
         lowest: float = -2.0) -> float:
    """beta: 1 when the step plan (time in proportion to share x cost) makes `target_steps` in
    `seconds`, else the beta in [lowest, 1] at which it does (the steps made fall as beta rises:
    bisection), or `lowest` when even that makes fewer."""
    if steps_made(shares, costs, seconds, 1.0) >= target_steps:
        return 1.0
    if steps_made(shares, costs, seconds, lowest) <= target_steps:
        return lowest
    low, high = lowest, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if steps_made(shares, costs, seconds, mid) >= target_steps:
            low = mid
        else:
            high = mid
    return low


def budget_plan(stages: Sequence[Stage], step_seconds: Sequence[float], seconds: float, target_steps: float,
                lowest_tilt: float = -2.0) -> List[Stage]:
    """`stages` with their `seconds` of `seconds` (the budget left) and predicted step cost: time
    in proportion to share x cost^beta, beta from `tilt` (at least `lowest_tilt`)."""
    shares = [s.share for s in stages]
    beta = tilt(shares, step_seconds, seconds, target_steps, lowest_tilt)
    weights = [s * c ** beta for s, c in zip(shares, step_seconds)]
    return [Stage(stage.factor, stage.share, seconds * w / sum(weights), c)
            for stage, w, c in zip(stages, weights, step_seconds)]


def describe(stages: Sequence[Stage], width: int, height: int) -> str:
    """One line of the plan, for the log: each size with its work share, and seconds when planned."""
    parts = []
    for stage in stages:
        w, h = downscaled_size(width, height, stage.factor)
        name = "full size" if stage.factor == 1 else f"1/{stage.factor}"
        timing = "" if stage.seconds is None else f", {stage.seconds:.0f} s"
        timing += "" if stage.steps is None else f" ~ {stage.steps:.0f} steps"
        parts.append(f"{name} {w}x{h} ({stage.share:.0%} of the work{timing})")
    return " -> ".join(parts)
