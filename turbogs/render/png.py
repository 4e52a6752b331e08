"""Renders as 8-bit PNG files (and frames): the one place a float image becomes bytes."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import torch

from turbogs.fileio import atomic_path


def to_uint8(image: torch.Tensor) -> np.ndarray:
    """[H, W, 3] float in [0, 1] -> BGR uint8 for cv2.imwrite."""
    rgb = (image.detach().clamp(0, 1).cpu().numpy() * 255 + 0.5).astype(np.uint8)
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR)


def write_png(path: Path, image: torch.Tensor) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if not cv2.imwrite(str(tmp), to_uint8(image)):
            raise OSError(f"could not write {path}")
