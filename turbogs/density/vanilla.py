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
happened, too big ones too (in world space; on screen only if asked, see max_screen_size). Every
`opacity_reset_every` steps all opacities are capped at 0.01, which lets pruning
remove the Gaussians the following steps do not make opaque again (floaters).

Step convention (INRIA's): `step` is the 1-based number of the step whose backward
pass just ran. The hooks and their order: turbogs/density/base.py.

A run with a time budget does not know its step count beforehand, so there the window and
the resets follow the run's progress instead (`by_progress`): the schedule's position is
progress x `schedule_steps`, and a reset comes when the position passes a multiple of
`opacity_reset_every`. Counted in raw steps, INRIA's 30k-step schedule put the first reset
at step 3000 of a 3.5k-step run and never closed the window (the run collapsed).
The cadence (`densify_every`) stays in steps: each densification needs that many views.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Dict, Optional

import torch

from turbogs.density import rows
from turbogs.density.base import DensityConfig, DensityStep, Strategy, check_rows
from turbogs.errors import InputError
from turbogs.gaussians import Gaussians

INRIA_TOTAL_STEPS = 30_000  # the run length INRIA's schedule was tuned for


@dataclass
class VanillaDensityConfig(DensityConfig):
    """INRIA's defaults, tuned for 30k steps; use `scaled(total_steps)` for shorter runs."""

    name = "3dgs"
    step_counted = ("densify_from", "densify_until", "densify_every", "opacity_reset_every", "schedule_steps")

    grad_threshold: float = 0.0002  # mean NDC gradient norm that triggers growth
    densify_from: int = 500  # densify only at steps > this ...
    densify_until: int = 15_000  # ... and < this (statistics and resets stop here too)
    densify_every: int = 100
    opacity_reset_every: int = 3000
    prune_opacity: float = 0.005  # prune Gaussians less opaque than this
    percent_dense: float = 0.01  # clone if max scale <= this * extent, else split
    # Prune if the largest 2D radius (pixels) since the last densification exceeds this; None = off.
    # The paper says 20, but INRIA's code zeroes the radii before the test, so it never fires (its
    # tracker's #123), and gsplat leaves it off: the 3dgs baseline runs as INRIA's code does.
    max_screen_size: Optional[float] = None
    big_world_scale: float = 0.1  # prune if max scale > this * extent (after the first reset)
    split_into: int = 2  # children per split Gaussian
    max_gaussians: Optional[int] = None  # hard cap on the count; growth picks the highest gradients
    schedule_steps: int = INRIA_TOTAL_STEPS  # the run length the step-counted settings above are for
    by_progress: bool = False  # a time-budget run: the window and resets follow progress x schedule_steps

    def __post_init__(self):
        for name in ("densify_every", "opacity_reset_every", "split_into"):
            if getattr(self, name) < 1:
                raise InputError(f"density setting {name} must be at least 1, got {getattr(self, name)}")
        if self.max_gaussians is not None and self.max_gaussians < 1:
            raise InputError(f"density setting max_gaussians must be at least 1 (or unset), got {self.max_gaussians}")

    def build(self) -> "VanillaDensity":
        return VanillaDensity(self)

    def scaled(self, total_steps: int, by_progress: bool = False) -> "VanillaDensityConfig":
        """The schedule for a run of `total_steps` (<= 30k), for short CPU runs and benchmarks.

        The densification window shrinks in proportion (it stops at half the run, as
        INRIA's 15k of 30k), but the cadence does not: each densification can double the
        count, so it stays every `densify_every` (100) steps, starts no earlier than one
        period in, and the opacity resets (which cost ~100 steps of recovery each) come no
        more often than every 3 periods. Runs of 30k steps or more keep INRIA's numbers.
        Example: 2000 steps -> densify over (100, 1000) every 100 steps, reset every 300.
        `by_progress`: a time-budget run, whose `total_steps` is only its most (module docstring).
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
            schedule_steps=scale(self.schedule_steps),
            by_progress=by_progress,
        )


class VanillaDensity(Strategy):
    """The 3DGS clone / split / prune / opacity-reset schedule."""

    def __init__(self, config: Optional[VanillaDensityConfig] = None):
        self.config = config or VanillaDensityConfig()
        # By progress only: the position at the last control call and the step of the last reset.
        # Not checkpointed: a resumed run sees its first crossing one step late at worst.
        self._previous_position: Optional[float] = None
        self._last_reset_step = 0

    def position(self, step_info: DensityStep) -> float:
        """Where the run is in the schedule, in steps: the step, or with a time budget
        progress x schedule_steps."""
        cfg = self.config
        return step_info.progress * cfg.schedule_steps if cfg.by_progress else step_info.step

    def _reset_due(self, step: int, position: float) -> bool:
        """INRIA's reset every `opacity_reset_every` steps. By progress: when the position passes
        a multiple of it, and no sooner than `scaled()` allows (3 densifications) after the last."""
        cfg = self.config
        if not cfg.by_progress:
            return step % cfg.opacity_reset_every == 0
        previous, self._previous_position = self._previous_position, position
        crossed = previous is not None and position // cfg.opacity_reset_every > previous // cfg.opacity_reset_every
        return crossed and step - self._last_reset_step >= min(3 * cfg.densify_every, cfg.opacity_reset_every)

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
    def observe(self, state: Dict[str, torch.Tensor], step_info: DensityStep) -> Dict[str, torch.Tensor]:
        """One view's NDC gradient norms, visibility and 2D radii (while densifying)."""
        if self.position(step_info) >= self.config.densify_until:
            return {}
        n = len(step_info.gaussians)
        check_rows(state, n)
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
        grad_ndc = grad * _ndc_scale(width, height, step_info.grad_scale, grad.device, grad.dtype)
        # Masked arithmetic rather than boolean indexing: no host sync on the GPU.
        dtype = state["grad2d"].dtype
        return {"grad2d": torch.where(visible, grad_ndc.norm(dim=-1), 0.0),
                "count": visible.to(dtype),
                "max_radii2d": torch.where(visible, radii.to(dtype), 0.0)}

    @torch.no_grad()
    def control(self, state: Dict[str, torch.Tensor], step_info: DensityStep) -> Dict[str, object]:
        """On schedule (by step number), densify, prune and reset. Updates `state` in place
        and returns what happened, for logging."""
        cfg = self.config
        step, gaussians, optimizers = step_info.step, step_info.gaussians, step_info.optimizers
        stats = {"densified": False, "n_cloned": 0, "n_split": 0, "n_pruned": 0, "opacity_reset": False}
        position = self.position(step_info)
        reset_due = self._reset_due(step, position)
        if position < cfg.densify_until:
            if position > cfg.densify_from and step % cfg.densify_every == 0 and step_info.good():
                stats.update(self._densify_and_prune(state, position, gaussians, optimizers, step_info.scene_extent))

            if step > 0 and reset_due and step_info.good():
                reset_opacity(gaussians, optimizers, ceiling=0.01)
                self._last_reset_step = step
                stats["opacity_reset"] = True
        stats["n_gaussians"] = len(gaussians)
        return stats

    def _densify_and_prune(self, state, position, gaussians, optimizers, scene_extent) -> Dict[str, object]:
        """Clone, split, then prune what the clone and split leave, as INRIA: every decision is
        a mask over the current rows first (the new rows' prune tests from their parents'
        values), then one host read of the sizes, then one rebuild by index."""
        cfg = self.config
        n = len(gaussians)
        log_scales = gaussians.params["scales"].detach()
        mean_grad = state["grad2d"] / state["count"].clamp_min(1)
        max_scale = torch.exp(log_scales).max(dim=-1).values
        high_grad = mean_grad >= cfg.grad_threshold
        small = max_scale <= cfg.percent_dense * scene_extent
        # Clones are appended with zero accumulated gradient, so they are not split.
        clone, to_split = self._within_cap(high_grad & small, high_grad & ~small, mean_grad, n)

        # Prune tests for the three kinds of row the clone and split leave: the old rows, the
        # clones (their parent's values, zero radii) and the children (smaller scales, zero radii).
        transparent = gaussians.opacities.detach() < cfg.prune_opacity
        prune_old = prune_clone = prune_child = transparent
        if position > cfg.opacity_reset_every:  # after the first reset: too big in the world
            big = cfg.big_world_scale * scene_extent
            child_scale = torch.exp(rows.child_log_scales(log_scales, cfg.split_into)).max(dim=-1).values
            prune_old = prune_clone = transparent | (max_scale > big)  # a clone has its parent's scale
            prune_child = transparent | (child_scale > big)
            if cfg.max_screen_size is not None:  # and, if asked, on screen (new rows have no radii yet)
                prune_old = prune_old | (state["max_radii2d"] > cfg.max_screen_size)
        keep_old, keep_clone, keep_child = ~to_split & ~prune_old, clone & ~prune_clone, to_split & ~prune_child
        count = rows.read_counts(clone=clone, split=to_split, old=keep_old, clones_kept=keep_clone,
                                 children_kept=keep_child)  # the one host read

        clones = rows.mask_index(clone, count["clone"])
        parents = rows.mask_index(to_split, count["split"])
        new_kept = torch.cat([rows.mask_index(keep_clone.index_select(0, clones), count["clones_kept"])]
                             + [count["clone"] + block * count["split"]
                                + rows.mask_index(keep_child.index_select(0, parents), count["children_kept"])
                                for block in range(cfg.split_into)])
        state.update(rows.grow(gaussians, optimizers, rows.mask_index(keep_old, count["old"]), clones=clones,
                               parents=parents, n=cfg.split_into, new_kept=new_kept, extra=state))

        for value in state.values():  # statistics restart after every densification
            value.zero_()
        n_pruned = ((n - count["split"] - count["old"]) + (count["clone"] - count["clones_kept"])
                    + cfg.split_into * (count["split"] - count["children_kept"]))
        return {"densified": True, "n_cloned": count["clone"], "n_split": count["split"], "n_pruned": n_pruned}

    def _within_cap(self, clone, to_split, mean_grad, n):
        """Keep only the highest-gradient growth candidates that fit under max_gaussians (all
        of them when they fit), with no host read: the candidates sorted by gradient (the
        others last), and those whose running cost fits the room."""
        cap = self.config.max_gaussians
        if cap is None:
            return clone, to_split
        growth = self.config.split_into - 1  # net rows added per split; a clone adds 1
        cost = clone.long() + to_split.long() * growth
        candidate = cost > 0
        order = torch.argsort(torch.where(candidate, mean_grad, -math.inf), descending=True, stable=True)
        fits = torch.cumsum(cost.index_select(0, order), dim=0) <= max(0, cap - n)
        picked = torch.zeros_like(clone).index_copy_(0, order, fits & candidate.index_select(0, order))
        return clone & picked, to_split & picked


@torch.no_grad()
def reset_opacity(gaussians: Gaussians, optimizers: rows.Optimizers, ceiling: float = 0.01) -> None:
    """INRIA's reset: opacity <- min(opacity, ceiling), done in logit space (sigmoid is
    monotone, so this is exact), with the opacity moments zeroed."""
    logits = gaussians.params["opacities"].detach()
    capped = torch.minimum(logits, torch.logit(torch.tensor(ceiling, dtype=logits.dtype, device=logits.device)))
    rows.set_values(gaussians, optimizers, "opacities", capped)


@functools.lru_cache(maxsize=16)
def _ndc_scale(width: int, height: int, grad_scale: float, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """[2]: pixel-to-NDC gradient factors (width / 2, height / 2) times grad_scale, made once
    per view size: one multiply per view instead of a split, two and a stack."""
    return torch.tensor([width / 2.0 * grad_scale, height / 2.0 * grad_scale], device=device, dtype=dtype)
