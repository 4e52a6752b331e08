"""A step of several views: which views this rank trains, and how the views' results add up.

A step trains V = ranks x batch_views views. Every rank draws the same V views (one shared
random stream: the tile sampler's Gumbel top-k, or INRIA's shuffled order) and trains slots
rank*B .. rank*B+B-1 of them, so that no two ranks train the same view in a step and 2 ranks
of 1 view compute exactly what 1 process of `--batch-views 2` does.

Each view's loss is divided by V before its backward pass, so the gradients summed over the
views and ranks are those of the step's mean loss. Then one collective on one flat buffer
carries everything that is summed: the gradients (of the higher SH bands only the active
degree's: the others are 0 on every rank), density control's statistics, the loss and
PSNR for the progress bar, the visible Gaussians, the curvature estimates and, zero-padded by
slot, every view's tile errors (an all-gather by a sum: each rank fills its own slots). A
statistic combined by maximum (INRIA's largest screen radius) travels in the same collective
(World.reduce_sum_and_max).
One view on one process does none of this: its results pass through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from torch import Tensor

from turbogs.distributed.world import World


@dataclass
class ViewResult:
    """What one trained view leaves for the rest of the step (its gradients are in .grad)."""

    loss: Tensor  # 0-d, detached, before the division by V
    psnr: Tensor  # 0-d, NaN when no pixel was both rendered and inside the mask
    visible: Tensor  # [N] bool
    tile_errors: Optional[Tensor] = None  # [K] for the error memory
    curvature: Optional[Dict[str, Tensor]] = None
    statistics: Dict[str, Tensor] = field(default_factory=dict)  # density control's, of this view


@dataclass
class StepTotals:
    """The step's figures, the same on every rank."""

    loss: Tensor  # the mean over the step's views
    psnr: Tensor  # the mean over the views that have one
    visible: Tensor  # [N] bool: seen by any view of the step
    tile_errors: List[Optional[Tensor]]  # per slot of the step (every rank's views)
    curvature: Optional[Dict[str, Tensor]] = None  # the mean over the views
    statistics: Dict[str, Tensor] = field(default_factory=dict)  # density control's, combined by its reductions


def rank_slots(world: World, batch_views: int) -> range:
    """The slots of the step's shared draw that this rank trains."""
    return range(world.rank * batch_views, (world.rank + 1) * batch_views)


def slot_generator(seed: int, step: int, slot: int) -> torch.Generator:
    """A random stream of its own for one view of one step (the curvature probe of a step of
    several views): the same on whichever rank trains the slot, and after --resume."""
    state = np.random.SeedSequence([seed, step, slot]).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & 0x7FFF_FFFF_FFFF_FFFF)


def combine(views: Sequence[ViewResult], world: World, params: Sequence[Tensor], reductions: Dict[str, str],
            tile_counts: Sequence[int], batch_views: int,
            grad_columns: Sequence[Optional[int]] = ()) -> StepTotals:
    """Sum the views of this rank and of every rank: gradients (in place, in `.grad`), and the
    figures and density statistics (each by its `reductions` entry, "sum" or "max") returned.
    `tile_counts`: each slot's number of sampled tiles (known to every rank from the shared
    draw; empty without tile sampling). `grad_columns`: per parameter, in order, how many
    leading columns of its gradient can be nonzero (None or missing: all;
    Gaussians.gradient_columns): only those are sent, the rest are 0 on every rank."""
    if len(views) == 1 and world.size == 1:
        only = views[0]
        return StepTotals(only.loss, only.psnr, only.visible, [only.tile_errors], only.curvature, only.statistics)

    total_views = batch_views * world.size
    first = views[0]
    has_psnr = torch.stack([~torch.isnan(view.psnr) for view in views])
    psnrs = torch.stack([view.psnr for view in views])
    figures = torch.stack([torch.stack([view.loss for view in views]).sum(),
                           torch.where(has_psnr, psnrs, 0.0).sum(), has_psnr.sum().to(psnrs.dtype)])
    visible = torch.stack([view.visible for view in views]).sum(0, dtype=torch.float32)
    curvature = None if first.curvature is None else {
        name: torch.stack([view.curvature[name] for view in views]).sum(0) for name in first.curvature}
    statistics = {key: _combine_views([view.statistics[key] for view in views], reductions.get(key, "sum"))
                  for key in first.statistics}
    tiles = torch.zeros(total_views, max(tile_counts, default=0), device=visible.device)
    for slot, view in zip(rank_slots(world, batch_views), views):
        if view.tile_errors is not None:
            tiles[slot, : tile_counts[slot]] = view.tile_errors.detach().float()

    if world.size > 1:
        for param in params:  # a rank must send every gradient, even one its views did not reach
            if param.grad is None:
                param.grad = torch.zeros_like(param)
        columns = list(grad_columns) + [None] * (len(params) - len(grad_columns))
        grads = [p.grad if used is None else p.grad[:, :used] for p, used in zip(params, columns)]
        summed = [figures, visible, tiles, *(curvature or {}).values(), *grads,
                  *[value for key, value in statistics.items() if reductions.get(key, "sum") == "sum"]]
        maxed = [value for key, value in statistics.items() if reductions.get(key, "sum") == "max"]
        _reduce_in_place(world, summed, maxed)

    loss, psnr_sum, psnr_count = figures.unbind(0)
    per_slot = [tiles[slot, :count] for slot, count in enumerate(tile_counts)] or [None] * total_views
    return StepTotals(loss / total_views, psnr_sum / psnr_count, visible > 0, per_slot,
                      None if curvature is None else {name: value / total_views for name, value in curvature.items()},
                      statistics)


def _combine_views(values: List[Tensor], reduction: str) -> Tensor:
    """One statistic of this rank's views, combined (one view's as it is: nothing reads a
    view's statistics after the step combined them, so the collective may write into it)."""
    if len(values) == 1:
        return values[0]
    stacked = torch.stack(values)
    return stacked.amax(0) if reduction == "max" else stacked.sum(0)


def _reduce_in_place(world: World, summed: List[Tensor], maxed: List[Tensor]) -> None:
    """`summed` summed and `maxed` maximised over the ranks, in place, by one collective on
    two flat buffers (flattened here and copied back)."""
    flat_sum = _flatten(summed)
    flat_max = _flatten(maxed) if maxed else flat_sum.new_zeros(0)
    world.reduce_sum_and_max(flat_sum, flat_max)
    for tensors, flat in ((summed, flat_sum), (maxed, flat_max)):
        offset = 0
        for tensor in tensors:
            size = tensor.numel()
            tensor.copy_(flat[offset: offset + size].view_as(tensor))
            offset += size


def _flatten(tensors: List[Tensor]) -> Tensor:
    return torch.cat([tensor.detach().reshape(-1).to(torch.float32) for tensor in tensors])
