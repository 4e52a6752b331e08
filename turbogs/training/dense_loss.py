"""The dense photometric loss of 3DGS: every pixel of the view, L1 and D-SSIM.

The turbo preset replaces it with the tile-wise loss of turbogs/turbo/losses.py, which reads
only the sampled tiles; this one is what the 3dgs preset (and --no-sparse off the error
memory) trains with.
"""

from __future__ import annotations

from typing import Optional

import torch

from turbogs.metrics import ssim


def photometric_loss(image: torch.Tensor, gt: torch.Tensor, mask: Optional[torch.Tensor], lambda_ssim: float) -> torch.Tensor:
    """(1 - l) * L1 + l * (1 - SSIM), as INRIA's; masked-out pixels are excluded from both terms."""
    if mask is not None:
        m = mask[..., None]
        l1 = ((image - gt).abs() * m).sum() / (m.sum() * 3).clamp_min(1)
        image, gt = image * m, gt * m
    else:
        l1 = (image - gt).abs().mean()
    return (1 - lambda_ssim) * l1 + lambda_ssim * (1 - ssim(image, gt))
