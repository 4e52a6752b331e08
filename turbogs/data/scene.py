"""The in-memory scene every reader produces and every other layer consumes.

Conventions (the same as COLMAP, OpenCV and gsplat):
- `world_to_cam` maps world points into a camera whose x points right, y down and
  z forward (into the scene).
- `K` holds pixel intrinsics at the *loaded* resolution; pixel centers sit at
  (i + 0.5, j + 0.5).
- Images are float32 RGB in [0, 1], shape [H, W, 3], on the CPU.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import List, Optional

import numpy as np
import torch


@dataclass
class Camera:
    """One posed, undistorted view with its image."""

    name: str  # image file name, unique within the scene (used for the split and outputs)
    width: int
    height: int
    K: torch.Tensor  # [3, 3] float32 pinhole intrinsics in pixels
    world_to_cam: torch.Tensor  # [4, 4] float32, OpenCV convention
    image: Optional[torch.Tensor] = None  # [H, W, 3] float32 in [0, 1]
    mask: Optional[torch.Tensor] = None  # [H, W] float32, 1 where the pixel counts in the loss
    # [H, W] float32: the photo's own alpha, where an RGBA photo was composited onto the scene's
    # background at load (NeRF-synthetic), so that training can composite it onto another one.
    alpha: Optional[torch.Tensor] = None
    image_path: str = ""  # where the image came from, for messages

    @property
    def center(self) -> torch.Tensor:
        """Camera center in world coordinates: -R^T t."""
        R = self.world_to_cam[:3, :3]
        t = self.world_to_cam[:3, 3]
        return -R.T @ t

    @property
    def fov_x(self) -> float:
        return 2.0 * math.atan(self.width / (2.0 * float(self.K[0, 0])))

    @property
    def fov_y(self) -> float:
        return 2.0 * math.atan(self.height / (2.0 * float(self.K[1, 1])))

    def resized(self, width: int, height: int) -> "Camera":
        """This camera for its image resampled to width x height, without the image: the
        intrinsics scaled per axis, so that a pixel centre (i + 0.5) maps to the same ray."""
        scale = torch.tensor([width / self.width, height / self.height, 1.0], dtype=self.K.dtype, device=self.K.device)
        return dataclasses.replace(self, width=width, height=height, K=self.K * scale[:, None],
                                   image=None, mask=None, alpha=None)


@dataclass
class Scene:
    """Train and test views, plus the points to initialise Gaussians from."""

    train: List[Camera]
    test: List[Camera] = field(default_factory=list)
    points: Optional[np.ndarray] = None  # [P, 3] float32 SfM points, or None
    point_colors: Optional[np.ndarray] = None  # [P, 3] float32 in [0, 1]
    points_source: str = ""  # where the points came from, for the log ("COLMAP points3D", a .ply)
    scene_box: Optional[np.ndarray] = None  # [2, 3] world min/max the capture declares (instant-ngp aabb)
    source_path: str = ""
    white_background: bool = False

    @property
    def cameras(self) -> List[Camera]:
        return list(self.train) + list(self.test)

    def background(self, device=None) -> torch.Tensor:
        """The colour behind the Gaussians [3]: white for captures composited on white (-w),
        else black, as INRIA renders them."""
        return torch.full((3,), 1.0 if self.white_background else 0.0, device=device)

    def extent(self) -> float:
        """INRIA's `cameras_extent`: 1.1 x the largest distance of a training camera
        from the cameras' mean center. Learning rates and densification scale with it."""
        centers = torch.stack([c.center for c in self.train])
        mean = centers.mean(dim=0)
        radius = float((centers - mean).norm(dim=1).max())
        return 1.1 * max(radius, 1e-6) if radius > 0 else 1.0
