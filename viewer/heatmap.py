"""The error memory of one training view, painted over that view's image.

The memory holds one error value per 16x16 tile ([TH, TW]). Each tile becomes a block
of color (nearest-neighbour upsampling keeps the tile grid visible), colored by
cv2's TURBO map from 0 (dark blue) to the view's largest error (dark red), then blended
over the image so one can see *where* in the picture training is still wrong.
"""

from __future__ import annotations

from typing import Optional, Tuple

import cv2
import numpy as np

from .splats import to_numpy

BLEND = 0.55  # weight of the heat colors over the photo
DEFAULT_SIZE = (192, 144)  # (width, height) when the view has no image


def colorize(error: np.ndarray, size: Tuple[int, int], crop: Optional[Tuple[int, int]] = None) -> Tuple[np.ndarray, float]:
    """[TH, TW] errors -> (uint8 RGB color map, the error that maps to red).
    The map is drawn at `size` (width, height) and then cropped to `crop` (width, height):
    the tile grid overhangs an image whose sides are not multiples of the tile size."""
    error = np.nan_to_num(np.asarray(error, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    error = np.maximum(error, 0.0)
    peak = float(error.max()) if error.size else 0.0
    levels = np.zeros_like(error) if peak <= 0 else error / peak
    levels_u8 = np.round(levels * 255.0).astype(np.uint8)
    blocks = cv2.resize(levels_u8, size, interpolation=cv2.INTER_NEAREST)
    if crop is not None:
        blocks = blocks[: crop[1], : crop[0]]
    bgr = cv2.applyColorMap(np.ascontiguousarray(blocks), cv2.COLORMAP_TURBO)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), peak


def error_overlay(
    error, image: Optional[np.ndarray], view_size: Optional[Tuple[int, int]] = None,
    tile_size: int = 16, blend: float = BLEND,
) -> Tuple[np.ndarray, float]:
    """Blend the colored error map over `image` (uint8 RGB, e.g. a thumbnail) -> (uint8 RGB, peak).

    view_size: (width, height) of the full-resolution view the tiles were measured on;
    tiles then land exactly where they cover the image. Without it the grid is
    stretched over the image. Without an image the map is blended over grey."""
    error = to_numpy(error)
    if error.ndim != 2:
        raise ValueError(f"error map must be [TH, TW], got shape {error.shape}")
    if image is None:
        if view_size is None:
            return colorize(error, DEFAULT_SIZE)
        # No photo: a neutral grey canvas of the view's shape keeps the tiles aligned.
        factor = min(1.0, max(DEFAULT_SIZE) / max(view_size))
        image = np.full((max(1, round(view_size[1] * factor)), max(1, round(view_size[0] * factor)), 3), 128, np.uint8)
    height, width = image.shape[:2]
    if view_size is None:
        heat, peak = colorize(error, (width, height))
    else:
        tiles_h, tiles_w = error.shape
        grid = (round(tiles_w * tile_size * width / view_size[0]), round(tiles_h * tile_size * height / view_size[1]))
        heat, peak = colorize(error, (max(grid[0], width), max(grid[1], height)), crop=(width, height))
    mixed = blend * heat.astype(np.float32) + (1.0 - blend) * image[..., :3].astype(np.float32)
    return np.clip(mixed + 0.5, 0, 255).astype(np.uint8), peak
