"""Render Gaussians into one camera: the one entry point of the rasterization chain.

`render()` strings the four ops of `turbogs.kernels` together (project -> SH colors -> tile
intersections -> compositing). It never looks at the device; `turbogs.kernels` sends the
work to gsplat's CUDA kernels or to the torch twins in `kernels/raster_torch.py`.

With a `tile_mask`, only the selected 16x16 tiles are composited: the other tiles' pairs
are dropped before rasterization, and their colors are undefined (zero on the CPU,
background on the GPU): never read them or let a loss touch them. Their alpha is 0 on both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from turbogs import kernels
from turbogs.data.scene import Camera
from turbogs.gaussians import Gaussians
from turbogs.tiles import TILE_SIZE, tile_grid

EPS2D = 0.3  # screen-space blur added to every splat, as in gsplat and INRIA's 3DGS


@dataclass
class RenderOutput:
    image: Tensor  # [H, W, 3]
    alpha: Tensor  # [H, W, 1]
    extra: Optional[Tensor]  # [H, W, E] composited extra per-Gaussian features, or None
    means2d: Tensor  # [N, 2]; retains its grad when grad is enabled (densification reads it)
    radii: Tensor  # [N] int, the larger of the two screen radii; 0 = not visible
    depths: Tensor  # [N] camera-space z (0 where not visible)
    visible: Tensor  # [N] bool: reaches a rendered tile (in the view, and with a tile_mask one of its tiles)
    tile_mask: Optional[Tensor]  # [TH, TW] bool, the tiles that were composited


def render(
    gaussians: Gaussians,
    camera: Camera,
    *,
    sh_degree: Optional[int] = None,
    background: Optional[Tensor] = None,
    tile_mask: Optional[Tensor] = None,
    extra_features: Optional[Tensor] = None,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    antialiased: Optional[bool] = None,
) -> RenderOutput:
    """Render `gaussians` as seen from `camera`.

    sh_degree: SH bands to use; defaults to `gaussians.active_sh_degree`.
    background: [3] color behind the Gaussians (black when None).
    tile_mask: [TH, TW] bool; only these tiles are composited (see the module docstring).
    extra_features: [N, E] per-Gaussian values composited like colors (background 0),
        e.g. a channel of ones whose gradient is each Gaussian's share of the error.
    antialiased: Mip-Splatting's 2D filter with opacity compensation (gsplat's
        rasterize_mode="antialiased"); None = the model's own mode, `gaussians.antialiased`,
        so that a model trained with it is evaluated, rendered and viewed with it.
    """
    means = gaussians.means
    device, dtype = means.device, means.dtype
    width, height = camera.width, camera.height
    tile_height, tile_width = tile_grid(height, width)
    degree = gaussians.active_sh_degree if sh_degree is None else sh_degree
    if not 0 <= degree <= gaussians.sh_degree:
        raise ValueError(f"sh_degree {degree} is outside 0..{gaussians.sh_degree} stored in the Gaussians")
    if tile_mask is not None:
        if tuple(tile_mask.shape) != (tile_height, tile_width):
            raise ValueError(
                f"tile_mask has shape {tuple(tile_mask.shape)}, expected {(tile_height, tile_width)} "
                f"for a {width}x{height} image"
            )
        tile_mask = tile_mask.to(device=device, dtype=torch.bool)
    if extra_features is not None and (extra_features.dim() != 2 or extra_features.shape[0] != len(gaussians)):
        raise ValueError(f"extra_features has shape {tuple(extra_features.shape)}, expected [{len(gaussians)}, E]")
    if background is not None and background.numel() != 3:
        raise ValueError(f"background has shape {tuple(background.shape)}, expected [3]")

    viewmat = camera.world_to_cam.to(device=device, dtype=dtype)
    K = camera.K.to(device=device, dtype=dtype)
    antialiased = gaussians.antialiased if antialiased is None else antialiased
    # The stored quaternions go in as they are (every backend normalizes them), and what reaches
    # none of the rendered tiles is culled here, so that SH, sorting and the backward skip it.
    radii_xy, means2d, depths, conics, *compensation = kernels.project(
        means, gaussians.params["quats"], gaussians.scales, viewmat, K, width, height, near_plane, far_plane, EPS2D,
        antialiased=antialiased, tile_mask=tile_mask, tile_size=TILE_SIZE,
    )
    opacities = gaussians.opacities * compensation[0] if antialiased else gaussians.opacities
    if means2d.requires_grad:
        means2d.retain_grad()

    # View-dependent color, as in 3DGS: SH evaluated along camera-center -> Gaussian.
    dirs = means - camera.center.to(device=device, dtype=dtype)
    visible = (radii_xy > 0).all(dim=-1)
    sh = kernels.spherical_harmonics_parts(degree, dirs, gaussians.params["sh0"], gaussians.params["shN"], visible)
    colors = torch.clamp_min(sh + 0.5, 0.0)

    if background is not None:
        background = background.to(device=device, dtype=dtype).reshape(3)
    num_extra = 0
    if extra_features is not None:
        num_extra = extra_features.shape[-1]
        colors = torch.cat([colors, extra_features.to(device=device, dtype=dtype)], dim=-1)
        if background is not None:
            background = torch.cat([background, background.new_zeros(num_extra)])

    isect_offsets, flatten_ids = kernels.intersect_tiles(
        means2d, radii_xy, depths, TILE_SIZE, tile_width, tile_height, tile_mask
    )
    pixels, alpha = kernels.rasterize(
        means2d, conics, colors, opacities, width, height, TILE_SIZE,
        isect_offsets, flatten_ids, background, tile_mask,
    )

    radii = radii_xy.max(dim=-1).values  # where culled, 0 on both axes
    return RenderOutput(
        image=pixels[..., :3],
        alpha=alpha,
        extra=pixels[..., 3:] if num_extra else None,
        means2d=means2d,
        radii=radii,
        depths=depths,
        visible=visible,
        tile_mask=tile_mask,
    )
