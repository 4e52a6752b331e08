"""TurboGS's own ops on the CPU: the tile loss in C++ (cuda/cpu/tile_loss_cpu.cpp, built with
the rest of the CPU kernels, `raster_cpu`), the error memory and sampling keys as their twins.

Why only the loss: it is some 150 small torch ops forward and backward over every sampled
tile, 15 ms for a whole 250x165 view on one core, 14 % of a full turbo step at 10k Gaussians;
the memory update and the sampling keys touch one row of a few hundred numbers a step.
The C++ functions have the CUDA bindings' signatures, so the one autograd function of
`turbo_cuda` (`fused_tile_loss`) drives both.
"""

from __future__ import annotations

from turbogs.kernels import raster_cpu, turbo_torch
from turbogs.kernels.turbo_cuda import fused_tile_loss


# The twins, looked up at each call (so that a wrapper set on turbo_torch, such as the step
# audit's op counter, sees these calls too).
def memory_update(errors, view, num_tiles, tile_ids, tile_errors, decay):
    return turbo_torch.memory_update(errors, view, num_tiles, tile_ids, tile_errors, decay)


def view_sample_keys(errors, tile_counts, view_floor, uniforms):
    return turbo_torch.view_sample_keys(errors, tile_counts, view_floor, uniforms)


def tile_sample_keys(errors_row, gamma, tile_floor, uniforms):
    return turbo_torch.tile_sample_keys(errors_row, gamma, tile_floor, uniforms)


def tile_loss(render, gt, tile_ids, mask, params):
    """Same inputs, outputs and rules as `turbo_torch.tile_loss`, in C++ (float32 and float64)."""
    return fused_tile_loss(raster_cpu.native_module(), render, gt, tile_ids, mask, params)
