"""Error-driven density control: grow where the image is still wrong, prune what adds nothing.

Vanilla 3DGS grows where the view-space positional gradient is large, a proxy for error.
TurboGS asks the error directly. Each step renders only some tiles, and for those tiles
it knows the per-pixel error err(p). Gaussian i's *blame* is its share of that error,

    blame_i = sum_p w_i(p) * err(p),        w_i(p) = alpha_i(p) * T_i(p),

the blending weight it has in pixel p times the error there, summed over the sampled
pixels. Its *coverage* is the same sum with err = 1, its total blending weight.

How the blame is measured in the ordinary backward pass: the renderer composites
per-Gaussian extra features like colors, extra(p) = sum_i w_i(p) f_i. Render two extra
channels from a probe f = 0 [N, 2] that requires grad, and add to the loss

    blame_term = sum_p extra_0(p) * err(p) + extra_1(p) * 1     (sampled pixels only).

Its gradient with respect to the probe is exactly (blame_i, coverage_i), because w does
not depend on f. Because the probe is zero, the term's value is 0 and its gradient with
respect to every other parameter, sum_p sum_i (d w_i(p) / d theta) f_i err(p), is 0 too:
the extra channels add a zero color, so the weights' gradients get nothing from them.
One backward pass, no second graph, and the other gradients are exactly those of the
loss alone.

The strategy keeps four per-Gaussian sums over a window (since the last densification):
blame, coverage, the number of steps in which the Gaussian's screen footprint overlapped a
sampled tile ("exposures"), and its opacity gradient ("fade", dL / d opacity logit: positive
when the loss would make it more transparent). Every `densify_every` steps while the run's
progress is in [densify_from, densify_until) it
1. prunes Gaussians that are nearly transparent (opacity), tiny (largest scale below a
   floor), or hidden (exposed often, yet almost no blending weight: occluded or faint);
2. grows the Gaussians with the highest blame per exposure, among those the loss wants to
   keep (fade <= 0): clones the small ones (a region needs one more Gaussian), splits the
   large ones (one blob covers detail it cannot represent), within a budget. Why the fade
   test: a Gaussian whose opacity the loss is lowering is one it wants gone (a floater, a
   blob in front of the surface); its error is its own presence, and splitting it makes two;
3. from a fifth of the run on, decays every opacity, so that Gaussians the loss does not
   keep opaque (floaters, points started in empty space) fall below the pruning threshold.
   Without it a floater persists: sparse sampling renders it rarely, over a white background
   it turns white rather than transparent, and its blame makes it grow.

The budget, `budget_at(progress, pixel_share)`, rises linearly from the starting count to
`max_gaussians`, and while coarse to fine trains on smaller images, no further than their share
of the requested size's pixels: a model for a quarter of the pixels needs about a quarter of the
Gaussians (DashGaussian grows the count with the resolution too). Growth never takes the count
above it. The turbo preset runs for a wall-clock budget, so every schedule here is a function of
the run's progress in [0, 1] (training/progress.py), not of the step number.

In the trainer's hooks (turbogs/density/base.py): `render_features` is the probe (while the
statistics are used), `extra_loss` the blame term, `observe` reads the probe's gradient, and
`control` densifies on schedule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from torch import Tensor

from turbogs.density import rows
from turbogs.density.base import DensityConfig, DensityStep, Strategy, check_rows
from turbogs.errors import InputError
from turbogs.gaussians import Gaussians
from turbogs.tiles import listed_pixels, listed_values, sampled_pixels

PROBE_CHANNELS = 2  # extra render channels: 0 = error-weighted, 1 = plain blending weight


# --- measuring blame -----------------------------------------------------------------


def make_probe(n: int, device=None, dtype=torch.float32) -> Tensor:
    """The zero [N, 2] leaf to render as `extra_features`; after backward its `.grad` holds
    (blame, coverage) per Gaussian. Zero, so that the blame term changes no other gradient."""
    return torch.zeros(n, PROBE_CHANNELS, device=device, dtype=dtype, requires_grad=True)


@torch.no_grad()
def pixel_error(image: Tensor, gt: Tensor, tile_mask: Optional[Tensor] = None,
                mask: Optional[Tensor] = None) -> Tensor:
    """Per-pixel error for the blame: |image - gt| averaged over the channels, times the
    optional loss mask [H, W]; exactly 0 outside the sampled tiles, whatever the renderer
    left there (NaN included). Detached: it weights the blame, it is not trained through."""
    height, width = image.shape[:2]
    inside = sampled_pixels(tile_mask, width, height, image.device)
    err = (image - gt.to(image)).abs().mean(dim=-1)
    if mask is not None:
        err = err * mask.to(err)
    return torch.where(inside, err, torch.zeros((), dtype=err.dtype, device=err.device))


def blame_term(out, pixel_error_map: Tensor, tile_mask: Optional[Tensor] = None) -> Tensor:
    """A scalar to ADD to the loss. Its value is 0, it leaves every other gradient as it is,
    and its gradient with respect to the probe rendered as `out.extra` is, per Gaussian,
    (sum_p w_i(p) err(p), sum_p w_i(p)) over the pixels of the sampled tiles.

    out: a RenderOutput rendered with extra_features = make_probe(...).
    pixel_error_map: [H, W] error, read only inside the sampled tiles.
    tile_mask: [TH, TW] the sampled tiles (None = the whole image)."""
    extra = out.extra
    if extra is None or extra.shape[-1] != PROBE_CHANNELS:
        raise ValueError(f"blame_term needs a render with extra_features = make_probe(n) ({PROBE_CHANNELS} channels)")
    height, width = extra.shape[:2]
    if tuple(pixel_error_map.shape) != (height, width):
        raise ValueError(f"pixel_error_map has shape {tuple(pixel_error_map.shape)}, expected {(height, width)}")
    inside = sampled_pixels(tile_mask, width, height, extra.device)
    zero = torch.zeros((), dtype=extra.dtype, device=extra.device)
    # torch.where, not a product: pixels outside the sampled tiles are undefined (maybe NaN),
    # and 0 * NaN would poison the value; where() never lets them through, not even in backward.
    err = torch.where(inside, pixel_error_map.detach().to(extra.dtype), zero)
    targets = torch.stack([err, inside.to(extra.dtype)], dim=-1)  # [H, W, 2]
    return (torch.where(inside[..., None], extra, zero) * targets).sum()


def tile_blame_term(out, image: Tensor, gt: Tensor, tile_ids: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """blame_term(out, pixel_error(image, gt, tile_mask, mask), tile_mask) read from the listed
    tiles' pixels alone (`tile_ids`, the tiles of tile_mask): the same value, 0, and the same
    probe gradient, while a step on a quarter of the tiles does a quarter of the image's work.
    Each listed pixel is gathered once (positions past the image's edge are masked out), and
    the probe's gradient comes back through the gather into those pixels only."""
    extra = out.extra
    if extra is None or extra.shape[-1] != PROBE_CHANNELS:
        raise ValueError(f"blame_term needs a render with extra_features = make_probe(n) ({PROBE_CHANNELS} channels)")
    height, width = extra.shape[:2]
    flat, valid = listed_pixels(tile_ids, height, width)
    with torch.no_grad():
        err = (listed_values(image.detach(), flat) - listed_values(gt, flat).to(image)).abs().mean(dim=-1)
        if mask is not None:
            err = err * listed_values(mask, flat).reshape(-1).to(err)
        targets = torch.stack([err, torch.ones_like(err)], dim=-1).to(extra.dtype)  # [M, 2]
    zero = torch.zeros((), dtype=extra.dtype, device=extra.device)
    # torch.where, not a product: what the gather read past the edge, and anything undefined, never counts
    picked = torch.where(valid[:, None], listed_values(extra, flat), zero)
    return (picked * torch.where(valid[:, None], targets, zero)).sum()


# --- the strategy -----------------------------------------------------------------


@dataclass
class ErrorDensityConfig(DensityConfig):
    """Schedules are fractions of the run's progress in [0, 1]."""

    name = "error"
    step_counted = ("densify_every",)

    densify_from: float = 0.02  # densify while densify_from <= progress < densify_until
    densify_until: float = 0.7
    densify_every: int = 100  # steps between densifications (the statistics window)
    max_gaussians: int = 1_000_000  # the budget at budget_full_at and after
    budget_start: Optional[int] = None  # the budget at densify_from; None = the initial count
    budget_full_at: float = 0.6  # the budget rises linearly from densify_from to here
    grow_ratio: float = 1.0  # grow only Gaussians whose blame per exposure >= this x the mean
    # At most this share of the Gaussians grows per densification. Growing more closes most of the
    # gap to 3dgs at equal steps but loses in a 100 s CPU run on most captures (more Gaussians,
    # fewer steps).
    grow_fraction: float = 0.1
    percent_dense: float = 0.01  # clone if max scale <= this x scene extent, else split
    split_into: int = 2  # children per split Gaussian
    prune_opacity: float = 0.005  # prune Gaussians less opaque than this
    prune_min_scale: float = 1e-4  # prune if max scale < this x scene extent (0 = off)
    hidden_weight: float = 0.01  # prune if mean blending weight per exposure is below this ...
    hidden_min_exposures: int = 5  # ... over at least this many exposures in the window
    # ... from this progress on. Before the sampler's dense phase has made the surfaces opaque, a
    # random start is layers of Gaussians at 0.1 opacity along every ray, and most of them have
    # little weight only because those in front have not faded yet: pruning them then threw away
    # the start (on the fox, most of it at the first densification).
    hidden_from: float = 0.2
    # opacity <- opacity x this after each densification (1 = off) from opacity_decay_from on: a
    # Gaussian the loss does not hold opaque (a point in empty space, a floater matching the
    # background) fades below prune_opacity in a few densifications. Every Gaussian starts at 0.1,
    # so the decay waits for the sampler's dense phase (the first fifth of the run) to have made the
    # surfaces opaque (decaying from the start cost the demo much of its surfaces). Chosen on the demo
    # and the object on white, whose floaters it removes.
    opacity_decay: float = 0.6
    opacity_decay_from: float = 0.2

    def __post_init__(self):
        def check(ok: bool, what: str):
            if not ok:
                raise InputError(f"error density setting: {what}")

        check(0 <= self.densify_from < self.densify_until <= 1,
              f"need 0 <= densify_from ({self.densify_from}) < densify_until ({self.densify_until}) <= 1")
        check(self.densify_from <= self.budget_full_at <= 1,
              f"need densify_from ({self.densify_from}) <= budget_full_at ({self.budget_full_at}) <= 1")
        for name in ("densify_every", "split_into", "max_gaussians", "hidden_min_exposures"):
            check(getattr(self, name) >= 1, f"{name} must be at least 1, got {getattr(self, name)}")
        check(self.budget_start is None or self.budget_start >= 0,
              f"budget_start must be >= 0 (or unset), got {self.budget_start}")
        check(0 < self.grow_fraction <= 1, f"grow_fraction must be in (0, 1], got {self.grow_fraction}")
        check(0 < self.opacity_decay <= 1, f"opacity_decay must be in (0, 1], got {self.opacity_decay}")
        check(0 <= self.opacity_decay_from <= 1, f"opacity_decay_from must be in [0, 1], got {self.opacity_decay_from}")
        check(0 <= self.hidden_from <= 1, f"hidden_from must be in [0, 1], got {self.hidden_from}")
        for name in ("grow_ratio", "percent_dense", "prune_opacity", "prune_min_scale", "hidden_weight"):
            check(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")

    def build(self) -> "ErrorDrivenDensity":
        return ErrorDrivenDensity(self)


class ErrorDrivenDensity(Strategy):
    """Blame-driven clone / split, opacity / size / visibility pruning, under a budget.

    `state` is a dict of per-Gaussian [N] tensors, kept in step with the rows by passing it
    through `turbogs.density.rows` as `extra`:
      blame    sum over the window of sum_p w_i(p) err(p)
      weight   sum over the window of sum_p w_i(p) (coverage)
      exposed  number of steps in the window whose sampled tiles the Gaussian overlapped
    """

    def __init__(self, config: Optional[ErrorDensityConfig] = None):
        self.config = config or ErrorDensityConfig()
        # The budget's starting count: the configured one, else set by initial_state().
        self.start_count = self.config.budget_start if self.config.budget_start is not None else 0
        self._opacity_grad_before = (-1, None)  # see _view_opacity_gradient

    # --- state and schedule -------------------------------------------------------
    def initial_state(self, n: int, device: torch.device | str = "cpu") -> Dict[str, Tensor]:
        """Zero statistics; also fixes the budget's starting count to n unless configured."""
        if self.config.budget_start is None:
            self.start_count = int(n)
        self._opacity_grad_before = (-1, None)  # (step, the opacity gradient after its last view)
        return {key: torch.zeros(n, device=device) for key in ("blame", "weight", "exposed", "fade")}

    def budget_at(self, progress: float, pixel_share: float = 1.0) -> int:
        """The most Gaussians allowed at `progress`: the starting count until densify_from,
        linear up to max_gaussians at budget_full_at, then max_gaussians; at most the start plus
        `pixel_share` (the training images' pixels over the requested size's) of the growth.
        A start above max_gaussians just means no growth."""
        cfg = self.config
        start, end = min(self.start_count, cfg.max_gaussians), cfg.max_gaussians
        progress = min(max(float(progress), 0.0), 1.0)
        span = cfg.budget_full_at - cfg.densify_from
        t = 1.0 if span <= 0 else min(max((progress - cfg.densify_from) / span, 0.0), 1.0)
        t = min(t, max(float(pixel_share), 0.0))
        return start + int(math.floor(t * (end - start) + 1e-9))  # slack: 0.35 - 0.1 is not 0.25

    def needs_blame(self, progress: float) -> bool:
        """Whether this step's statistics are used; when False, skip the probe (it costs
        two extra render channels)."""
        return float(progress) < self.config.densify_until

    def should_densify(self, step: int, progress: float) -> bool:
        cfg = self.config
        return step > 0 and step % cfg.densify_every == 0 and cfg.densify_from <= float(progress) < cfg.densify_until

    # --- hooks --------------------------------------------------------------------
    def render_features(self, n: int, progress: float, device=None) -> Optional[Tensor]:
        """The probe while this step's statistics are used, else None."""
        return make_probe(n, device) if self.needs_blame(progress) else None

    def extra_loss(self, render_out, image: Tensor, gt: Tensor, tile_mask: Optional[Tensor],
                   mask: Optional[Tensor], tile_ids: Optional[Tensor] = None) -> Optional[Tensor]:
        """The blame term (value 0) when the probe was rendered: the error the loss sees, read
        from the sampled tiles alone when they are listed."""
        if render_out.extra is None:
            return None
        if tile_ids is not None and tile_mask is not None:
            return tile_blame_term(render_out, image, gt, tile_ids, mask)
        return blame_term(render_out, pixel_error(image, gt, tile_mask, mask), tile_mask)

    @torch.no_grad()
    def observe(self, state: Dict[str, Tensor], step_info: DensityStep) -> Dict[str, Tensor]:
        """One view's blame, weight and exposures (the probe's gradient [N, 2] in
        step_info.features, required while needs_blame(progress)), and its fade (the view's
        opacity gradient)."""
        if not self.needs_blame(step_info.progress):
            return {}
        n = len(step_info.gaussians)
        check_rows(state, n)
        probe = step_info.features
        blame = None if probe is None else probe.grad
        if blame is None:
            raise RuntimeError("no blame given: render with extra_features=make_probe(n), add blame_term to the "
                               "loss, and pass probe.grad as blame")
        if tuple(blame.shape) != (n, PROBE_CHANNELS):
            raise ValueError(f"blame has shape {tuple(blame.shape)}, expected [{n}, {PROBE_CHANNELS}]")
        blame = blame.to(state["blame"])
        if step_info.grad_scale != 1.0:  # the view's share of the step's mean loss, undone
            blame = blame * step_info.grad_scale
        render_out = step_info.render
        exposed = render_out.visible  # the render culls what reaches no sampled tile (tiles.boxes_touch_tiles)
        fade = self._view_opacity_gradient(step_info).to(blame) * step_info.grad_scale
        return {"blame": blame[:, 0], "weight": blame[:, 1], "exposed": exposed.to(blame.dtype), "fade": fade}

    def _view_opacity_gradient(self, step_info: DensityStep) -> Tensor:
        """[N] this view's dL / d opacity logit. The parameter's .grad holds the sum over the
        step's views so far (they add up until the optimizer steps), so what it held after the
        step's previous view is taken off. A clone per view only when a step has several."""
        n = len(step_info.gaussians)
        grad = step_info.gaussians.params["opacities"].grad
        if grad is None:
            return torch.zeros(n, device=step_info.gaussians.params["opacities"].device)
        grad = grad.detach().reshape(n)
        step, before = self._opacity_grad_before
        this_view = grad - before if step == step_info.step and before is not None else grad
        self._opacity_grad_before = (step_info.step, grad.clone() if step_info.grad_scale != 1.0 else None)
        return this_view

    @torch.no_grad()
    def control(self, state: Dict[str, Tensor], step_info: DensityStep) -> Dict[str, object]:
        """On schedule, prune, grow and decay. Updates `state` (and, when densifying, the
        Gaussians and optimizers) in place and returns what happened, for logging."""
        step, progress, gaussians = step_info.step, step_info.progress, step_info.gaussians
        stats: Dict[str, object] = {"densified": False, "n_cloned": 0, "n_split": 0, "n_pruned": 0}
        if self.needs_blame(progress) and self.should_densify(step, progress) and step_info.good():
            stats.update(self.densify_and_prune(state, gaussians, step_info.optimizers, step_info.scene_extent,
                                                progress, step_info.pixel_share))
        stats["n_gaussians"] = len(gaussians)
        stats["budget"] = self.budget_at(progress, step_info.pixel_share)
        return stats

    # --- densification ------------------------------------------------------------
    @torch.no_grad()
    def densify_and_prune(self, state: Dict[str, Tensor], gaussians: Gaussians, optimizers: rows.Optimizers,
                          scene_extent: float, progress: float, pixel_share: float = 1.0) -> Dict[str, object]:
        """Prune, then grow into the room the budget leaves, then decay opacities; the
        window's statistics restart. Returns counts of what happened."""
        cfg = self.config
        n = len(gaussians)
        max_scale = torch.exp(gaussians.params["scales"].detach()).max(dim=-1).values
        exposed = state["exposed"]

        # 1. Prune.
        low_opacity = gaussians.opacities.detach() < cfg.prune_opacity
        tiny = max_scale < cfg.prune_min_scale * scene_extent
        hidden = ((exposed >= cfg.hidden_min_exposures) & (state["weight"] < cfg.hidden_weight * exposed)
                  & (progress >= cfg.hidden_from))
        prune = low_opacity | tiny | hidden

        # 2. Choose growth among the survivors the loss keeps: highest blame per exposure first.
        score = state["blame"] / exposed.clamp_min(1)
        seen = (exposed > 0) & ~prune
        # The mean score of the seen survivors (0 when none), as a masked sum: no read.
        mean_score = torch.where(seen, score, 0.0).sum() / seen.sum().clamp_min(1)
        candidates = seen & (score >= cfg.grow_ratio * mean_score) & (score > 0) & (state["fade"] <= 0)
        small = max_scale <= cfg.percent_dense * scene_extent
        room = (self.budget_at(progress, pixel_share) - n + prune.sum()).clamp_min(0)
        grow = self._pick_growth(candidates, small, score, room, limit=int(cfg.grow_fraction * n))
        clone, to_split = grow & small, grow & ~small

        # 3. Apply, in one rebuild: the survivors that are not split, then the clones, then the
        # children (the order of remove_rows, duplicate and split one after another).
        kept = ~prune & ~to_split
        count = rows.read_counts(clone=clone, split=to_split, kept=kept, pruned=prune, opacity=low_opacity,
                                 tiny=tiny, hidden=hidden)  # the one host read
        state.update(rows.grow(gaussians, optimizers, rows.mask_index(kept, count["kept"]),
                               clones=rows.mask_index(clone, count["clone"]),
                               parents=rows.mask_index(to_split, count["split"]), n=cfg.split_into, extra=state))

        if cfg.opacity_decay < 1.0 and progress >= cfg.opacity_decay_from:
            decay_opacity(gaussians, cfg.opacity_decay)
        for value in state.values():  # the window restarts
            value.zero_()
        return {
            "densified": True,
            "n_cloned": count["clone"],
            "n_split": count["split"],
            "n_pruned": count["pruned"],
            "n_pruned_opacity": count["opacity"],
            "n_pruned_tiny": count["tiny"],
            "n_pruned_hidden": count["hidden"],
        }

    def _pick_growth(self, candidates: Tensor, small: Tensor, score: Tensor, room, limit: int) -> Tensor:
        """The highest-scoring candidates, at most `limit` of them, whose added rows (1 per
        clone, split_into - 1 per split) fit in `room` (an int or a 0-d device tensor). No host
        read: the candidates sorted by score (the others after them, at no cost), and those
        whose running cost fits."""
        order = torch.argsort(torch.where(candidates, score, -math.inf), descending=True, stable=True)[:limit]
        is_candidate = candidates.index_select(0, order)
        cost = torch.where(small.index_select(0, order), 1, self.config.split_into - 1) * is_candidate
        chosen = is_candidate & (torch.cumsum(cost, dim=0) <= room)
        return torch.zeros_like(candidates).index_copy_(0, order, chosen)


@torch.no_grad()
def decay_opacity(gaussians: Gaussians, factor: float) -> None:
    """opacity <- factor x opacity, done on the logits. Rows do not change and the optimizer
    moments are kept: a small nudge does not invalidate the trajectory they describe
    (unlike INRIA's reset, see rows.set_values)."""
    logits = gaussians.params["opacities"]
    decayed = torch.sigmoid(logits) * factor
    logits.copy_(torch.logit(decayed.clamp(1e-7, 1 - 1e-7)))
