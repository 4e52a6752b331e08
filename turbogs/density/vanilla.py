"""Vanilla 3DGS adaptive density control (Kerbl et al. 2023), as a pluggable strategy.

Between `densify_from` and `densify_until` the strategy averages, per Gaussian, the
norm of the view-space gradient of its projected center over the views that saw it.
A Gaussian whose average is high sits where the image is still wrong, so every
`densify_every` steps it is
- cloned when it is small (max scale <= percent_dense * extent): under-reconstruction,
  one more Gaussian is needed next to it;
- split in two smaller ones when it is large: over-reconstruction, one blob covers
  detail it cannot represent.
Then nearly transparent Gaussians are pruned and, once the first opacity reset has
happened, too big ones too (in world space, and on screen). Every
`opacity_reset_every` steps all opacities are capped at 0.01, which lets pruning
remove the Gaussians the following steps do not make opaque again (floaters).

Step convention (INRIA's): `step` is the 1-based number of the step whose backward
pass just ran. The hooks and their order: turbogs/density/base.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Dict, Optional

import torch

from turbogs.density import rows
from turbogs.density.base import DensityConfig, DensityStep, Strategy
from turbogs.errors import InputError
from turbogs.gaussians import Gaussians

INRIA_TOTAL_STEPS = 30_000  # the run length INRIA's schedule was tuned for


@dataclass
class VanillaDensityConfig(DensityConfig):
    """INRIA's defaults, tuned for 30k steps; use `scaled(total_steps)` for shorter runs."""

    name = "3dgs"
    step_counted = ("densify_from", "densify_until", "densify_every", "opacity_reset_every")

    grad_threshold: float = 0.0002  # mean NDC gradient norm that triggers growth
    densify_from: int = 500  # densify only at steps > this ...
    densify_until: int = 15_000  # ... and < this (statistics and resets stop here too)
    densify_every: int = 100
    opacity_reset_every: int = 3000
    prune_opacity: float = 0.005  # prune Gaussians less opaque than this
    percent_dense: float = 0.01  # clone if max scale <= this * extent, else split
    max_screen_size: Optional[float] = 20.0  # prune if max 2D radius (pixels) exceeds this; None = off
    big_world_scale: float = 0.1  # prune if max scale > this * extent (with max_screen_size)
    split_into: int = 2  # children per split Gaussian
    max_gaussians: Optional[int] = None  # hard cap on the count; growth picks the highest gradients

    def __post_init__(self):
        for name in ("densify_every", "opacity_reset_every", "split_into"):
            if getattr(self, name) < 1:
                raise InputError(f"density setting {name} must be at least 1, got {getattr(self, name)}")
        if self.max_gaussians is not None and self.max_gaussians < 1:
            raise InputError(f"density setting max_gaussians must be at least 1 (or unset), got {self.max_gaussians}")

    def build(self) -> "VanillaDensity":
        return VanillaDensity(self)

    def scaled(self, total_steps: int) -> "VanillaDensityConfig":
        """The schedule for a run of `total_steps` (<= 30k), for short CPU runs and benchmarks.

        The densification window shrinks in proportion (it stops at half the run, as
        INRIA's 15k of 30k), but the cadence does not: each densification can double the
        count, so it stays every `densify_every` (100) steps, starts no earlier than one
        period in, and the opacity resets (which cost ~100 steps of recovery each) come no
        more often than every 3 periods. Runs of 30k steps or more keep INRIA's numbers.
        Example: 2000 steps -> densify over (100, 1000) every 100 steps, reset every 300.
        """
        if total_steps < 1:
            raise ValueError(f"total_steps must be positive, got {total_steps}")
        ratio = min(1.0, total_steps / INRIA_TOTAL_STEPS)

        def scale(steps: int) -> int:
            return max(1, round(steps * ratio))

        return replace(
            self,
            densify_from=max(scale(self.densify_from), min(self.densify_every, self.densify_from)),
            densify_until=scale(self.densify_until),
            opacity_reset_every=max(scale(self.opacity_reset_every), min(3 * self.densify_every, self.opacity_reset_every)),
        )


class VanillaDensity(Strategy):
    """The 3DGS clone / split / prune / opacity-reset schedule."""

    def __init__(self, config: Optional[VanillaDensityConfig] = None):
        self.config = config or VanillaDensityConfig()

    # --- state --------------------------------------------------------------------
    def initial_state(self, n: int, device: torch.device | str = "cpu") -> Dict[str, torch.Tensor]:
        """Per-Gaussian accumulators since the last densification: the sum of NDC
        gradient norms, the number of views that saw the Gaussian, its largest 2D radius."""
        return {
            "grad2d": torch.zeros(n, device=device),
            "count": torch.zeros(n, device=device),
            "max_radii2d": torch.zeros(n, device=device),
        }

    # --- hooks --------------------------------------------------------------------
    def before_backward(self, state: Dict[str, torch.Tensor], render_out) -> None:
        """Make sure the 2D means keep their gradient through backward (the renderer
        already asks for it; asking twice is harmless)."""
        if render_out.means2d.requires_grad:
            render_out.means2d.retain_grad()

    reductions = {"max_radii2d": "max"}  # grad2d and count are sums

    @torch.no_grad()
    def observe(self, statistics: Dict[str, torch.Tensor], step_info: DensityStep) -> None:
        """Add one view's NDC gradient norms, visibility and 2D radii (while densifying)."""
        if step_info.step >= self.config.densify_until:
            return
        n = len(step_info.gaussians)
        if statistics["grad2d"].shape[0] != n:
            raise RuntimeError(
                f"density state has {statistics['grad2d'].shape[0]} rows but there are {n} Gaussians: "
                "rows changed without passing the state through turbogs.density.rows"
            )
        render_out, width, height = step_info.render, step_info.width, step_info.height
        grad = render_out.means2d.grad
        if grad is None:
            raise RuntimeError("render_out.means2d has no gradient: call before_backward before loss.backward()")
        if grad.shape != (n, 2):
            raise ValueError(f"means2d gradient has shape {tuple(grad.shape)}, expected [{n}, 2]")
        visible = render_out.visible.to(grad.device)
        radii = render_out.radii
        if radii.dim() == 2:  # per-axis radii: the footprint is the larger one
            radii = radii.max(dim=-1).values
        # INRIA differentiates w.r.t. NDC coordinates, which span 2 over the image:
        # d/d(ndc_x) = d/d(pixel_x) * width / 2, and likewise for y; times grad_scale, this
        # view's gradient as if it had been the step's only view.
        scale = step_info.grad_scale
        grad_ndc = torch.stack([grad[:, 0] * (width / 2.0 * scale), grad[:, 1] * (height / 2.0 * scale)], dim=-1)
        # Masked arithmetic rather than boolean indexing: no host sync on the GPU.
        statistics["grad2d"] += torch.where(visible, grad_ndc.norm(dim=-1), 0.0)
        statistics["count"] += visible
        seen_radii = torch.where(visible, radii.to(statistics["max_radii2d"]), 0.0)
        torch.maximum(statistics["max_radii2d"], seen_radii, out=statistics["max_radii2d"])

    @torch.no_grad()
    def control(self, state: Dict[str, torch.Tensor], step_info: DensityStep) -> Dict[str, object]:
        """On schedule (by step number), densify, prune and reset. Updates `state` in place
        and returns what happened, for logging."""
        cfg = self.config
        step, gaussians, optimizers = step_info.step, step_info.gaussians, step_info.optimizers
        stats = {"densified": False, "n_cloned": 0, "n_split": 0, "n_pruned": 0, "opacity_reset": False}
        if step < cfg.densify_until:
            if step > cfg.densify_from and step % cfg.densify_every == 0 and step_info.good():
                stats.update(self._densify_and_prune(state, step, gaussians, optimizers, step_info.scene_extent))

            if step > 0 and step % cfg.opacity_reset_every == 0 and step_info.good():
                reset_opacity(gaussians, optimizers, ceiling=0.01)
                stats["opacity_reset"] = True
        stats["n_gaussians"] = len(gaussians)
        return stats

    def _densify_and_prune(self, state, step, gaussians, optimizers, scene_extent) -> Dict[str, object]:
        cfg = self.config
        n_before = len(gaussians)
        mean_grad = state["grad2d"] / state["count"].clamp_min(1)
        max_scale = torch.exp(gaussians.params["scales"]).max(dim=-1).values
        high_grad = mean_grad >= cfg.grad_threshold
        small = max_scale <= cfg.percent_dense * scene_extent
        clone, to_split = self._within_cap(high_grad & small, high_grad & ~small, mean_grad, n_before)

        # Clone first; clones are appended with zero accumulated gradient, so they are not split.
        state.update(rows.duplicate(gaussians, optimizers, clone, extra=state))
        split_mask = torch.cat([to_split, torch.zeros(int(clone.sum()), dtype=torch.bool, device=to_split.device)])
        state.update(rows.split(gaussians, optimizers, split_mask, n=cfg.split_into, extra=state))

        prune = gaussians.opacities.detach() < cfg.prune_opacity
        if cfg.max_screen_size is not None and step > cfg.opacity_reset_every:
            # INRIA's reference code zeroes max_radii2D while densifying, before this
            # test, so its screen-size pruning never fires (its issue #123). Ours carries
            # the radii through the row operations, so it does what the paper describes;
            # set max_screen_size=None to match the reference code exactly.
            too_big_on_screen = state["max_radii2d"] > cfg.max_screen_size
            too_big_in_world = torch.exp(gaussians.params["scales"]).max(dim=-1).values > cfg.big_world_scale * scene_extent
            prune |= too_big_on_screen | too_big_in_world
        state.update(rows.remove_rows(gaussians, optimizers, ~prune, extra=state))

        for value in state.values():  # statistics restart after every densification
            value.zero_()
        return {"densified": True, "n_cloned": int(clone.sum()), "n_split": int(to_split.sum()), "n_pruned": int(prune.sum())}

    def _within_cap(self, clone, to_split, mean_grad, n):
        """Keep only the highest-gradient growth candidates that fit under max_gaussians."""
        cap = self.config.max_gaussians
        growth = self.config.split_into - 1  # net rows added per split; a clone adds 1
        cost = clone.long() + to_split.long() * growth
        if cap is None or int(cost.sum()) <= cap - n:
            return clone, to_split
        budget = max(0, cap - n)
        candidates = torch.nonzero(cost > 0).squeeze(1)
        order = candidates[torch.argsort(mean_grad[candidates], descending=True, stable=True)]
        chosen = order[torch.cumsum(cost[order], dim=0) <= budget]
        picked = torch.zeros_like(clone)
        picked[chosen] = True
        return clone & picked, to_split & picked


@torch.no_grad()
def reset_opacity(gaussians: Gaussians, optimizers: rows.Optimizers, ceiling: float = 0.01) -> None:
    """INRIA's reset: opacity <- min(opacity, ceiling), done in logit space (sigmoid is
    monotone, so this is exact), with the opacity moments zeroed."""
    logits = gaussians.params["opacities"].detach()
    capped = torch.minimum(logits, torch.logit(torch.tensor(ceiling, dtype=logits.dtype, device=logits.device)))
    rows.set_values(gaussians, optimizers, "opacities", capped)
