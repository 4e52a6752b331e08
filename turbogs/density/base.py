"""The interface every density-control strategy implements, and what the trainer hands it.

A strategy decides which Gaussians exist. The trainer knows no strategy by name: it calls
these hooks, in this order, every step (gsplat's Strategy, with the hooks TurboGS needs):

    state = strategy.initial_state(len(gaussians), device)          # once
    for each view this rank trains this step:
        features = strategy.render_features(len(gaussians), progress, device)
        out = render(..., extra_features=features)                  # extra channels, or None
        loss = photometric loss (+ strategy.extra_loss(out, image, gt, tile_mask, mask, tile_ids) when not None)
                                (+ strategy.regularizer(gaussians) when not None)
        strategy.before_backward(state, out); loss.backward()
        view_statistics = strategy.observe(state, DensityStep(...))  # this view's statistics
    statistics = the views' statistics combined, over the ranks too (`reductions`: "sum", or "max")
    optimizers step
    strategy.accumulate(state, statistics, ok)                      # nothing on a non-finite step
    stats = strategy.control(state, DensityStep(...))               # grow / prune on schedule

Why the statistics go through a per-step contribution: with several views per step, on one
process (--batch-views) or over ranks (--nproc), each rank adds its views' statistics and
one all-reduce makes them the same everywhere, so every rank grows and prunes the same
Gaussians in the same order. One view on one process adds its statistics to the state as
they are (`multiview.combine`). `after_backward` is the single-view form of the last three
hooks, in one call.

`state` is a dict of per-Gaussian tensors that the strategy keeps in step with the rows by
passing it through `turbogs.density.rows` as `extra`; the trainer checkpoints it. `stats` is
a dict of numbers the progress bar and the viewer show.

A strategy's settings are a dataclass deriving from `DensityConfig`; `TrainConfig.density`
holds one, and `build()` makes the strategy from it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Dict, Optional

import torch
from torch import Tensor

from turbogs.density import rows
from turbogs.gaussians import Gaussians


@dataclass
class DensityStep:
    """What the hooks see of the step whose backward pass just ran: `observe` one rendered view
    (render, width, height, features, grad_scale), `control` the step (no view)."""

    step: int  # its 1-based number (INRIA's convention)
    progress: float  # the elapsed fraction of the run in [0, 1]
    gaussians: Gaussians
    optimizers: rows.Optimizers
    render: object = None  # a view's RenderOutput: means2d (with .grad), radii, visible, tile_mask
    width: int = 0
    height: int = 0
    scene_extent: float = 1.0
    features: Optional[Tensor] = None  # the leaf render_features() returned; .grad holds its gradient
    # A 0-d device bool: False when the step's loss or a gradient was not finite. Such a step
    # must change nothing; the trainer does not read it, so statistics are masked by it, and
    # a scheduled change of the Gaussians reads it (`good()`). None = a good step.
    ok: Optional[Tensor] = None
    # The loss of a step of V views is the mean of their losses, so each view's gradients
    # arrive divided by V; statistics that INRIA defines per view multiply them back by this.
    grad_scale: float = 1.0
    # The training images' pixels over the requested size's: below 1 while coarse to fine trains small.
    pixel_share: float = 1.0
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


def check_rows(state: Dict[str, Tensor], n: int) -> None:
    """The state has a row per Gaussian: a strategy that grows or prunes passes it through
    `turbogs.density.rows`, which keeps them in step."""
    for key, value in state.items():
        if value.shape[0] != n:
            raise RuntimeError(f"density state {key!r} has {value.shape[0]} rows but there are {n} Gaussians: "
                               "rows changed without passing the state through turbogs.density.rows")


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
                   mask: Optional[Tensor], tile_ids: Optional[Tensor] = None) -> Optional[Tensor]:
        """A term to add to this step's loss, or None. `image` is the render as the loss compares
        it with `gt` (after the per-photo appearance correction, when there is one); `tile_ids`
        lists the tiles of `tile_mask` (the sampler's), for a term that reads only those."""
        return None

    def regularizer(self, gaussians: Gaussians) -> Optional[Tensor]:
        """A term on the Gaussians themselves (not on a render) to add to each view's loss, or
        None: 3DGS-MCMC's opacity and scale penalties."""
        return None

    def before_backward(self, state: Dict[str, Tensor], render_out) -> None:
        """Called just before each view's loss.backward()."""

    # How each statistic combines over the views of a step and over the ranks; "sum" unless named.
    reductions: ClassVar[Dict[str, str]] = {}

    def observe(self, state: Dict[str, Tensor], step: "DensityStep") -> Dict[str, Tensor]:
        """One rendered view's statistics (after its backward pass), keyed like `state` (read
        for its rows only): what this view adds to the step's, or {} when the step records
        none. Counts are float tensors, so that views add up. Reads nothing."""
        return {}

    def accumulate(self, state: Dict[str, Tensor], statistics: Dict[str, Tensor], ok: Optional[Tensor]) -> None:
        """Fold a step's statistics (combined over the views and ranks) into the state; nothing
        when `ok` (a device bool) is False. Masked arithmetic, no read."""
        not_ok = None if ok is None or not statistics else ~ok
        for key, value in statistics.items():
            if not_ok is not None:
                value = value.masked_fill(not_ok, 0.0)  # not value * ok: a NaN must not get through
            if self.reductions.get(key, "sum") == "max":
                torch.maximum(state[key], value, out=state[key])
            else:
                state[key] += value

    def control(self, state: Dict[str, Tensor], step: "DensityStep") -> Dict[str, object]:
        """On schedule, change the set of Gaussians. Returns stats."""
        raise NotImplementedError

    def after_backward(self, state: Dict[str, Tensor], step: "DensityStep") -> Dict[str, object]:
        """A step of one view, in one call: observe it, accumulate, control."""
        self.accumulate(state, self.observe(state, step), step.ok)
        return self.control(state, step)


class DensityConfig:
    """Base of the strategies' settings (each a dataclass). `name` is what --density takes."""

    name: ClassVar[str]
    max_gaussians: Optional[int]
    step_counted: ClassVar[tuple] = ()  # the settings counted in steps (a cadence, a start)

    def build(self) -> Strategy:
        raise NotImplementedError

    def scaled(self, total_steps: int, by_progress: bool = False) -> "DensityConfig":
        """These settings for a run of `total_steps` (with a time budget, `by_progress`: its most
        steps); schedules by progress need no change."""
        return self

    def per_views(self, views_per_step: int) -> "DensityConfig":
        """These settings for steps of several views: what is counted in steps is divided by
        the views per step, so that a decision still comes after as many views (gsplat's
        and Grendel-GS's rule for batched steps)."""
        if views_per_step == 1:
            return self
        return dataclasses.replace(self, **{name: max(1, round(getattr(self, name) / views_per_step))
                                            for name in self.step_counted})
