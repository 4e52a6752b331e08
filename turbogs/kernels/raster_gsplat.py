"""The CUDA rasterization chain: thin wrappers over gsplat 1.5.3's low-level kernels.

Each function has the signature and semantics of its twin in `raster_torch` (one camera,
no batch dimensions); here we only add and remove gsplat's leading camera dimension.
gsplat is imported inside the functions so that importing this module never touches CUDA;
`require()` makes a failed gsplat build one clear error instead of a NoneType traceback.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional, Tuple

import torch
from torch import Tensor

from turbogs.errors import TurboGSError
from turbogs.kernels.raster_torch import zero_culled
from turbogs.tiles import TILE_SIZE, boxes_touch_tiles, sampled_pixels


@lru_cache(maxsize=None)
def require() -> None:
    """Load gsplat's CUDA extension (it compiles itself on first import: minutes), or raise
    one line. gsplat itself only prints a warning and leaves its module handle None."""
    try:
        from gsplat.cuda._backend import _C
    except Exception as exc:
        raise TurboGSError(f"gsplat's CUDA kernels could not be built or loaded: {exc}") from None
    if _C is None:
        raise TurboGSError("gsplat's CUDA kernels are missing: gsplat found no CUDA toolkit (nvcc) to build them")


def project(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    viewmat: Tensor,
    K: Tensor,
    width: int,
    height: int,
    near_plane: float,
    far_plane: float,
    eps2d: float,
    antialiased: bool = False,
    tile_mask: Optional[Tensor] = None,
    tile_size: int = TILE_SIZE,
):
    from gsplat.cuda._wrapper import fully_fused_projection

    radii, means2d, depths, conics, compensations = fully_fused_projection(
        means, None, quats, scales, viewmat[None], K[None], width, height,
        eps2d=eps2d, near_plane=near_plane, far_plane=far_plane, calc_compensations=antialiased,
    )
    radii, means2d, depths, conics = radii[0], means2d[0], depths[0], conics[0]
    visible = (radii > 0).all(dim=-1)
    if tile_mask is not None:  # the twin's cull, in a few tensor ops on the device (no read)
        visible &= boxes_touch_tiles(means2d, radii, tile_mask, width, height, tile_size)
        radii = torch.where(visible[:, None], radii, 0)
    projected = zero_culled(radii, means2d, depths, conics, visible)
    if not antialiased:
        return projected
    return projected + (torch.where(visible, compensations[0], 0.0),)


def spherical_harmonics(degree: int, dirs: Tensor, coeffs: Tensor, masks: Optional[Tensor] = None) -> Tensor:
    from gsplat.cuda._wrapper import spherical_harmonics as gsplat_sh

    values = gsplat_sh(degree, dirs, coeffs, masks)
    # gsplat leaves a masked-out row's value unwritten (empty memory): 0, as the twin's
    return values if masks is None else torch.where(masks[:, None], values, 0.0)


def spherical_harmonics_parts(degree: int, dirs: Tensor, sh0: Tensor, rest: Tensor,
                              masks: Optional[Tensor] = None) -> Tensor:
    return spherical_harmonics(degree, dirs, torch.cat([sh0, rest[:, : (degree + 1) ** 2 - 1]], dim=1), masks)


@torch.no_grad()
def intersect_tiles(
    means2d: Tensor,
    radii: Tensor,
    depths: Tensor,
    tile_size: int,
    tile_width: int,
    tile_height: int,
    tile_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    from gsplat.cuda._wrapper import isect_offset_encode, isect_tiles

    _, isect_ids, flatten_ids = isect_tiles(
        means2d[None], radii[None], depths[None], tile_size, tile_width, tile_height
    )
    if tile_mask is not None:
        # One image, so the bits above the 32 depth bits are the tile id alone.
        keep = tile_mask.reshape(-1)[isect_ids >> 32]
        isect_ids, flatten_ids = isect_ids[keep], flatten_ids[keep]
    offsets = isect_offset_encode(isect_ids, 1, tile_width, tile_height)
    return offsets[0], flatten_ids


def rasterize(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    width: int,
    height: int,
    tile_size: int,
    isect_offsets: Tensor,
    flatten_ids: Tensor,
    background: Optional[Tensor] = None,
    tile_mask: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor]:
    from gsplat.cuda._wrapper import rasterize_to_pixels

    render_colors, render_alphas = rasterize_to_pixels(
        means2d[None], conics[None], colors[None], opacities[None], width, height, tile_size,
        isect_offsets[None], flatten_ids,
        backgrounds=None if background is None else background[None],
        masks=None if tile_mask is None else tile_mask[None],
    )
    colors, alphas = render_colors[0], render_alphas[0]
    if tile_mask is not None:
        # gsplat never writes the alphas of masked-out tiles (they hold whatever the memory
        # held): define them as 0, as the torch twin does, so that no reader sees garbage.
        inside = sampled_pixels(tile_mask, width, height, alphas.device, tile_size)
        alphas = torch.where(inside[..., None], alphas, 0.0)
    return colors, alphas
