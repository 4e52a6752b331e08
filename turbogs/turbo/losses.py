"""The photometric losses: TurboGS's tile-wise structure-aware loss over the sampled tiles
only (`TileLoss`), and the dense loss of 3DGS over every pixel of a view (`photometric_loss`:
L1 and D-SSIM, what the 3dgs preset, and turbo without the error memory, train with).

The tile-wise loss:

Each sampled 16x16 tile i gets its own loss

    L_i = L1_i + lambda_ssim * (1 - SSIM_i) + lambda_ncc * NCC-term_i

computed over the tile's *counted* pixels: pixels inside the image (the last tile row and
column may be partial) whose optional mask value is > 0. The mask value is a per-pixel
weight (1 = counts fully, 0 = ignored).

- L1_i: weighted mean of |render - gt| over counted pixels and the 3 channels.
- SSIM_i: the tile is cut into `ssim_patch` x `ssim_patch` blocks; each block gets the
  SSIM of its own (weighted) statistics with a uniform window, per channel, as in the
  8x8 block SSIM of Wang & Bovik. A fused kernel computes it from five moments per
  block, and it never reads a pixel outside the tile. SSIM_i is the mean over blocks
  (weighted by counted pixels) and channels.
- NCC: per `ncc_patch` block, one correlation over the 3 channels (each channel centred
  on its own mean), with eps added like SSIM's C3 so that identical blocks, flat ones
  included, give exactly 1 and the value stays in [-1, 1]:
      ncc = (sum_c cov_c + eps) / sqrt((sum_c var_r,c + eps) * (sum_c var_g,c + eps))
  Each block's (1 - ncc) is multiplied by a confidence that depends on the ground truth
  only: clamp(std_gt / ncc_std_ref, 0, 1), std_gt being the block's RMS channel standard
  deviation. A flat ground-truth block has no structure to correlate with, so it adds
  nothing and cannot produce large gradients.

The returned loss is the mean of L_i over the sampled tiles, each tile weighted by its
count of counted pixels (for full, unmasked tiles: the plain mean). A one-pixel edge tile
therefore cannot dominate a step, and a tile with no counted pixel adds nothing.
The per-tile values L_i are returned detached: they feed the error memory.

Pixels outside the sampled tiles are never read: the renderer leaves them undefined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import Tensor

from turbogs import kernels
from turbogs.errors import TurboGSError
from turbogs.metrics import ssim
from turbogs.tiles import TILE_SIZE


def _is_power_of_two(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


@dataclass
class LossConfig:
    tile_size: int = TILE_SIZE  # training needs the renderer's tiles (the Trainer checks); tests vary it
    lambda_ssim: float = 0.2
    lambda_ncc: float = 0.1
    ssim_patch: int = 8  # SSIM block size inside a tile (power of two dividing tile_size)
    ncc_patch: int = 8  # NCC block size inside a tile (power of two dividing tile_size)
    # Added to the covariance and both variance sums: about SSIM's C3 = C2 / 2 over 3 channels.
    # It bounds the NCC gradient on a flat render; identical blocks still give NCC = 1.
    ncc_eps: float = 1e-3
    ncc_std_ref: float = 0.02  # GT blocks with std below this get a proportionally lower NCC weight
    ssim_c1: float = 0.01**2  # SSIM constants for a data range of 1
    ssim_c2: float = 0.03**2

    def __post_init__(self):
        # The CUDA kernel runs one thread per tile pixel and reduces blocks with power-of-two trees.
        if not (_is_power_of_two(self.tile_size) and 2 <= self.tile_size <= 32):
            raise TurboGSError(f"loss config: tile_size must be a power of two in 2..32, got {self.tile_size}")
        for name in ("ssim_patch", "ncc_patch"):
            patch = getattr(self, name)
            if not (_is_power_of_two(patch) and patch <= self.tile_size):
                raise TurboGSError(
                    f"loss config: {name} must be a power of two <= tile_size {self.tile_size}, got {patch}"
                )
        for name in ("lambda_ssim", "lambda_ncc"):
            if getattr(self, name) < 0:
                raise TurboGSError(f"loss config: {name} must be >= 0, got {getattr(self, name)}")
        for name in ("ncc_eps", "ncc_std_ref", "ssim_c1", "ssim_c2"):
            if not getattr(self, name) > 0:
                raise TurboGSError(f"loss config: {name} must be > 0, got {getattr(self, name)}")


# --- the loss --------------------------------------------------------------------------


class TileLoss:
    """L1 + D-SSIM + NCC over sampled tiles (see the module docstring for the exact terms).

    On CUDA float32 inputs it runs the fused kernels of `turbogs._C` (forward and
    backward); elsewhere the torch twin, whose gradient comes from autograd."""

    def __init__(self, config: Optional[LossConfig] = None):
        self.config = config if config is not None else LossConfig()

    def __call__(
        self, render: Tensor, gt: Tensor, tile_ids: Tensor, mask: Optional[Tensor] = None
    ) -> Tuple[Tensor, Tensor]:
        """render, gt: [H, W, 3]; tile_ids: [K] int64 unique ids ty * TW + tx (ids outside
        the grid count as empty tiles); mask: optional [H, W] weights in [0, 1].

        Returns (loss scalar, tile_errors [K] detached per-tile loss)."""
        if render.dim() != 3 or render.shape[-1] != 3:
            raise ValueError(f"render must be [H, W, 3], got {tuple(render.shape)}")
        if gt.shape != render.shape:
            raise ValueError(f"gt shape {tuple(gt.shape)} differs from render shape {tuple(render.shape)}")
        if mask is not None and tuple(mask.shape) != tuple(render.shape[:2]):
            raise ValueError(f"mask must be [H, W] = {tuple(render.shape[:2])}, got {tuple(mask.shape)}")
        if tile_ids.dim() != 1:
            raise ValueError(f"tile_ids must be 1-D, got shape {tuple(tile_ids.shape)}")
        device, dtype = render.device, render.dtype
        gt = gt.to(device=device, dtype=dtype)
        if mask is not None:
            mask = mask.to(device=device, dtype=dtype)
        tile_ids = tile_ids.to(device=device, dtype=torch.int64)
        return kernels.tile_loss(render, gt, tile_ids, mask, self.config)


def photometric_loss(image: Tensor, gt: Tensor, mask: Optional[Tensor], lambda_ssim: float) -> Tensor:
    """INRIA's dense loss over every pixel of a view: (1 - l) * L1 + l * (1 - SSIM); masked-out
    pixels are excluded from both terms."""
    if mask is not None:
        m = mask[..., None]
        l1 = ((image - gt).abs() * m).sum() / (m.sum() * 3).clamp_min(1)
        image, gt = image * m, gt * m
    else:
        l1 = (image - gt).abs().mean()
    return (1 - lambda_ssim) * l1 + lambda_ssim * (1 - ssim(image, gt))
