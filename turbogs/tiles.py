"""Tile geometry: the one convention every part of TurboGS shares.

An image of H x W pixels is covered by TH x TW square tiles of TILE_SIZE pixels (the last
row and column may be partial). Tiles are numbered row-major, id = row * TW + col, and a
tile mask is a [TH, TW] bool tensor, shaped like the image it covers. The size is fixed:
gsplat's rasterizer and our CUDA kernels are compiled for 16 x 16 tiles, so it is a
constant here and not a setting.
"""

from __future__ import annotations

import functools
import weakref
from typing import Optional, Tuple

import torch
import torch.nn.functional as F
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


# The last answer of listed_pixels, kept as sampled_pixels keeps its own (below).
_last_listed = None


def listed_pixels(tile_ids: Tensor, height: int, width: int, tile_size: int = TILE_SIZE) -> Tuple[Tensor, Tensor]:
    """tile_pixel_index's answer flattened, [M] and [M] with M = K * ts * ts, for what reads
    only the sampled tiles' pixels (the blame term, the bar's PSNR). The answer for the last
    ids asked about is kept: a step asks for the same tiles twice, and each answer is a dozen
    ops. Callers must not change `tile_ids` in place."""
    global _last_listed
    key = (tile_ids._version, height, width, tile_size, str(tile_ids.device))
    if _last_listed is not None and _last_listed[0]() is tile_ids and _last_listed[1] == key:
        return _last_listed[2]
    flat, valid = tile_pixel_index(tile_ids, height, width, tile_size)
    answer = (flat.reshape(-1), valid.reshape(-1))
    _last_listed = (weakref.ref(tile_ids), key, answer)
    return answer


def listed_values(values: Tensor, flat: Tensor) -> Tensor:
    """[M, C]: the pixels of an [H, W, C] (or [H, W]: C = 1) tensor at listed_pixels' `flat`
    indices. By index_select, not values[flat]: the same values and gradient, several times
    faster on the CPU, and every step reads the sampled tiles this way more than once."""
    return values.reshape(values.shape[0] * values.shape[1], -1).index_select(0, flat)


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


@torch.no_grad()
def boxes_touch_tiles(means2d: Tensor, radii: Tensor, tile_mask: Optional[Tensor], width: int, height: int,
                      tile_size: int = TILE_SIZE) -> Tensor:
    """[N] bool: Gaussians with a radius whose screen box (center +- radius, in tiles: floor of
    the low side, ceil of the high side, clamped to the grid; the tile intersection's rule)
    overlaps at least one tile of `tile_mask` (every tile when None): those that can reach a
    rendered pixel. The renderer culls the others before SH and sorting, and density control
    counts the rest as exposed.
    One summed-area table of the mask answers every box in O(1): the four corners' entries,
    read in one gather (every training step runs this, so it is written in few ops)."""
    tile_height, tile_width = tile_grid(height, width, tile_size)
    device = means2d.device
    if tile_mask is None:
        tile_mask = torch.ones(tile_height, tile_width, dtype=torch.bool, device=device)
    # table[y, x] = the sampled tiles above and left of tile corner (x, y); flat, row-major
    table = F.pad(tile_mask.to(device).int().cumsum(0).cumsum(1), (1, 0, 1, 0)).reshape(-1)

    center = means2d.detach().float() / tile_size
    reach = radii.float() / tile_size
    low, high, corners, signs = _box_constants(tile_width, tile_height, device)
    box = torch.cat([torch.floor(center - reach), torch.ceil(center + reach)], dim=-1)  # [N, 4]: x0, y0, x1, y1
    box = torch.clamp(box, low, high).long()  # tile corners, inside the table
    count = (table[(box[:, None, :] * corners).sum(-1)] * signs).sum(-1)  # sampled tiles in the box
    return (radii > 0).all(dim=-1) & (count > 0)


@functools.lru_cache(maxsize=16)
def _box_constants(tile_width: int, tile_height: int, device: torch.device) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """What boxes_touch_tiles needs of a tile grid, made once per grid (a tensor built from host
    numbers every step is a host-to-device copy every step, which on CUDA waits for the queue):
    the box's limits [4], the rows [4, 4] that turn a box (x0, y0, x1, y1) into the flat
    table indices of its corners (x1, y1), (x1, y0), (x0, y1), (x0, y0), and their signs in
    the box's sum, + - - +."""
    row = tile_width + 1  # the table's row length
    low = torch.zeros(4, device=device)
    high = torch.tensor([tile_width, tile_height] * 2, dtype=torch.float32, device=device)
    corners = torch.tensor([[0, 0, 1, row], [0, row, 1, 0], [1, 0, 0, row], [1, row, 0, 0]], device=device)
    signs = torch.tensor([1, -1, -1, 1], device=device)
    return low, high, corners, signs
