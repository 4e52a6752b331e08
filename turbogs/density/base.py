"""The interface every density-control strategy implements, and what the trainer hands it.

A strategy decides which Gaussians exist. The trainer knows no strategy by name: it calls
these hooks, in this order, every step (gsplat's Strategy, with the hooks TurboGS needs):

    state = strategy.initial_state(len(gaussians), device)          # once
    features = strategy.render_features(len(gaussians), progress, device)
    out = render(..., extra_features=features)                      # extra channels, or None
    loss = photometric loss (+ strategy.extra_loss(out, image, gt, tile_mask, mask) when not None)
    strategy.before_backward(state, out); loss.backward()
    optimizers step
    stats = strategy.after_backward(state, DensityStep(...))        # grow / prune on schedule

`state` is a dict of per-Gaussian tensors that the strategy keeps in step with the rows by
passing it through `turbogs.density.rows` as `extra`; the trainer checkpoints it. `stats` is
a dict of numbers the progress bar and the viewer show.

A strategy's settings are a dataclass deriving from `DensityConfig`; `TrainConfig.density`
holds one, and `build()` makes the strategy from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Dict, Optional

import torch
from torch import Tensor

from turbogs.density import rows
from turbogs.gaussians import Gaussians


@dataclass
class DensityStep:
    """What `after_backward` sees of the step whose backward pass just ran."""

    step: int  # its 1-based number (INRIA's convention)
    progress: float  # the elapsed fraction of the run in [0, 1]
    gaussians: Gaussians
    optimizers: rows.Optimizers
    render: object  # its RenderOutput: means2d (with .grad), radii, visible, tile_mask
    width: int
    height: int
    scene_extent: float
    features: Optional[Tensor] = None  # the leaf render_features() returned; .grad holds its gradient
    # A 0-d device bool: False when the step's loss or a gradient was not finite. Such a step
    # must change nothing; the trainer does not read it, so statistics are masked by it, and
    # a scheduled change of the Gaussians reads it (`good()`). None = a good step.
    ok: Optional[Tensor] = None
    _good: Optional[bool] = field(default=None, repr=False, compare=False)

    def good(self) -> bool:
        """Whether the step was finite: one host read, for density control's scheduled steps only
        (remembered, so a step that both densifies and resets opacities reads once)."""
        if self.ok is None:
            return True
        if self._good is None:
            self._good = bool(self.ok)
        return self._good

    def seen(self, mask: Tensor) -> Tensor:
        """`mask` (e.g. the visible Gaussians), and nothing on a non-finite step; no read."""
        return mask if self.ok is None else mask & self.ok


class Strategy:
    """Base of the density strategies: every hook but after_backward does nothing."""

    config: "DensityConfig"

    def initial_state(self, n: int, device: torch.device | str = "cpu") -> Dict[str, Tensor]:
        return {}

    def render_features(self, n: int, progress: float, device=None) -> Optional[Tensor]:
        """Per-Gaussian features [N, E] to composite beside the colours this step, as a leaf
        that requires grad (its gradient comes back in DensityStep.features), or None."""
        return None

    def extra_loss(self, render_out, image: Tensor, gt: Tensor, tile_mask: Optional[Tensor],
                   mask: Optional[Tensor]) -> Optional[Tensor]:
        """A term to add to this step's loss, or None. `image` is the render as the loss compares
        it with `gt` (after the per-photo appearance correction, when there is one)."""
        return None

    def before_backward(self, state: Dict[str, Tensor], render_out) -> None:
        """Called just before loss.backward()."""

    def after_backward(self, state: Dict[str, Tensor], step: DensityStep) -> Dict[str, float]:
        """Read this step's statistics; on schedule, change the set of Gaussians. Returns stats."""
        raise NotImplementedError


class DensityConfig:
    """Base of the strategies' settings (each a dataclass). `name` is what --density takes."""

    name: ClassVar[str]
    max_gaussians: Optional[int]

    def build(self) -> Strategy:
        raise NotImplementedError

    def scaled(self, total_steps: int) -> "DensityConfig":
        """These settings for a run of `total_steps`; schedules by progress need no change."""
        return self
