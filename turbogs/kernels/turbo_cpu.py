"""TurboGS's own ops on the CPU: the tile loss in C++ (cuda/cpu/tile_loss_cpu.cpp, built with
the rest of the CPU kernels, `raster_cpu`), the error memory and sampling keys as their twins.

Why only the loss: it is some 150 small torch ops forward and backward over every sampled
tile, 15 ms for a whole 250x165 view on one core, 14 % of a full turbo step at 10k Gaussians;
the memory update and the sampling keys touch one row of a few hundred numbers a step.
The C++ functions have the CUDA bindings' signatures, so the one autograd function of
`turbo_cuda` (`fused_tile_loss`) drives both.
"""

from __future__ import annotations

from turbogs.kernels import raster_cpu
from turbogs.kernels.turbo_cuda import fused_tile_loss
from turbogs.kernels.turbo_torch import memory_update, tile_sample_keys, view_sample_keys

__all__ = ["memory_update", "tile_loss", "tile_sample_keys", "view_sample_keys"]


def tile_loss(render, gt, tile_ids, mask, params):
    """Same inputs, outputs and rules as `turbo_torch.tile_loss`, in C++ (float32 and float64)."""
    return fused_tile_loss(raster_cpu.native_module(), render, gt, tile_ids, mask, params)
