"""Tile geometry: the one convention every part of TurboGS shares.

An image of H x W pixels is covered by TH x TW square tiles of TILE_SIZE pixels (the last
row and column may be partial). Tiles are numbered row-major, id = row * TW + col, and a
tile mask is a [TH, TW] bool tensor, shaped like the image it covers. The size is fixed:
gsplat's rasterizer and our CUDA kernels are compiled for 16 x 16 tiles, so it is a
constant here and not a setting.
"""

from __future__ import annotations

import weakref
from typing import Optional, Tuple

import torch
from torch import Tensor

TILE_SIZE = 16


def tile_grid(height: int, width: int, tile_size: int = TILE_SIZE) -> Tuple[int, int]:
    """(TH, TW): tile rows and columns covering an H x W image, the shape of a tile mask."""
    return (height + tile_size - 1) // tile_size, (width + tile_size - 1) // tile_size


def tile_pixel_index(tile_ids: Tensor, height: int, width: int, tile_size: int = TILE_SIZE) -> Tuple[Tensor, Tensor]:
    """Where each pixel of each listed tile lives in a row-major [H, W] image.

    Returns flat [K, ts, ts] int64 indices into H*W and valid [K, ts, ts] bool. Pixels past
    the image border (partial tiles) and all pixels of ids outside the grid are invalid;
    their index is clamped to a pixel of the same tile so that it is always safe to read.
    """
    tile_height, tile_width = tile_grid(height, width, tile_size)
    num_tiles = tile_width * tile_height
    ids = tile_ids.to(torch.int64)
    in_grid = (ids >= 0) & (ids < num_tiles)
    ids = torch.where(in_grid, ids, torch.zeros_like(ids))
    offsets = torch.arange(tile_size, device=ids.device)
    y = (ids // tile_width)[:, None, None] * tile_size + offsets[None, :, None]  # [K, ts, 1]
    x = (ids % tile_width)[:, None, None] * tile_size + offsets[None, None, :]  # [K, 1, ts]
    valid = (y < height) & (x < width) & in_grid[:, None, None]
    flat = y.clamp(max=height - 1) * width + x.clamp(max=width - 1)
    return flat, valid


def gather_tiles(image: Tensor, tile_ids: Tensor, tile_size: int = TILE_SIZE) -> Tuple[Tensor, Tensor]:
    """The pixels of the listed tiles: [K, ts, ts, C] values and [K, ts, ts] validity.

    Only the listed tiles' pixels are read. Invalid positions hold a copy of a valid pixel
    of the same tile; callers must mask them (see `valid`)."""
    height, width = image.shape[:2]
    flat, valid = tile_pixel_index(tile_ids, height, width, tile_size)
    values = image.reshape(height * width, -1)[flat]
    return values, valid


# The last answer of sampled_pixels: (a weak reference to its tile mask, the mask's version and
# the other arguments, the answer). Weak, so that a freed mask's address reused by a new one
# is never mistaken for it; the version, so that a mask changed in place is recomputed.
_last_pixels = None


def sampled_pixels(tile_mask: Optional[Tensor], width: int, height: int, device=None,
                   tile_size: int = TILE_SIZE) -> Tensor:
    """[H, W] bool: True at the pixels of the sampled tiles (everywhere when tile_mask is None).
    The answer for the last mask asked about is kept: callers must not change it in place."""
    if tile_mask is None:
        return torch.ones(height, width, dtype=torch.bool, device=device)
    grid = tile_grid(height, width, tile_size)
    if tuple(tile_mask.shape) != grid:
        raise ValueError(f"tile_mask has shape {tuple(tile_mask.shape)}, expected {grid} for a {width}x{height} image")
    global _last_pixels
    key = (tile_mask._version, width, height, str(device), tile_size)
    if _last_pixels is not None and _last_pixels[0]() is tile_mask and _last_pixels[1] == key:
        return _last_pixels[2]  # a step asks for the same tiles' pixels three times (loss, blame, PSNR)
    full = tile_mask.to(device=device, dtype=torch.bool)
    full = full.repeat_interleave(tile_size, dim=0).repeat_interleave(tile_size, dim=1)[:height, :width]
    _last_pixels = (weakref.ref(tile_mask), key, full)
    return full


def sampled_pixel_values(image: Tensor, tile_ids: Optional[Tensor], tile_size: int = TILE_SIZE) -> Tensor:
    """[M, C]: the pixels of the listed tiles of an [H, W, C] image in row-major order, the
    order `image[sampled_pixels(...)]` lists them in, with no host read (a boolean index must
    read how many pixels it selects; here M = K * ts * ts follows from the shapes).

    Positions past the image border (partial tiles) come after the real pixels, as zeros that
    pass no gradient back: a sum over the rows is the same sum, and when every tile is whole
    (images whose sides are multiples of the tile size) this equals the boolean gather exactly.
    `tile_ids` None means every pixel."""
    height, width = image.shape[:2]
    pixels = image.reshape(height * width, -1)
    if tile_ids is None:
        return pixels
    flat, valid = tile_pixel_index(tile_ids, height, width, tile_size)
    flat, valid = flat.reshape(-1), valid.reshape(-1)
    # Sort by pixel index; the invalid positions get keys past every pixel, so they sort last.
    beyond = height * width + torch.arange(flat.numel(), device=flat.device)
    order = torch.argsort(torch.where(valid, flat, beyond))
    values = pixels.index_select(0, flat.index_select(0, order))
    return torch.where(valid.index_select(0, order)[:, None], values, torch.zeros((), dtype=values.dtype,
                                                                                 device=values.device))
