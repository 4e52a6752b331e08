"""Training cameras as the viewer shows them: a pose, a field of view and a thumbnail.

Two sources produce them: a model folder's `cameras.json` (INRIA's fields, cam-to-world
rotation rows and camera position) and, during live training, the scene's `Camera`s
(world-to-cam matrices). Both use the OpenCV convention (x right, y down, z forward),
which is also viser's, so no axis flips are needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

import cv2
import numpy as np
import viser.transforms as vtf

from turbogs.errors import InputError
from turbogs.fileio import read_json

THUMBNAIL_MAX_SIDE = 192  # pixels; enough to recognise a view, small enough to send hundreds
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".JPG", ".JPEG", ".PNG", ".webp", ".bmp", ".tif", ".tiff")


@dataclass
class ViewCamera:
    name: str
    width: int
    height: int
    fx: float
    fy: float
    cam_to_world: np.ndarray  # [4, 4] float64
    image_path: Optional[Path] = None
    thumbnail: Optional[np.ndarray] = None  # [h, w, 3] uint8 RGB, already small

    @property
    def position(self) -> np.ndarray:
        return self.cam_to_world[:3, 3]

    @property
    def wxyz(self) -> np.ndarray:
        return vtf.SO3.from_matrix(self.cam_to_world[:3, :3]).wxyz

    @property
    def fov_y(self) -> float:
        return 2.0 * math.atan(self.height / (2.0 * self.fy))

    @property
    def aspect(self) -> float:
        return self.width / self.height

    @property
    def forward(self) -> np.ndarray:
        return self.cam_to_world[:3, 2]

    @property
    def up(self) -> np.ndarray:
        """World direction that looks "up" on this camera's image (OpenCV y points down)."""
        return -self.cam_to_world[:3, 1]


def cameras_from_scene(cameras: Sequence) -> List[ViewCamera]:
    """turbogs.data.scene.Camera list -> ViewCamera list, with thumbnails from the loaded images."""
    out = []
    for cam in cameras:
        w2c = cam.world_to_cam.detach().double().cpu().numpy()
        thumb = None
        if cam.image is not None:
            thumb = make_thumbnail((cam.image.detach().cpu().numpy().clip(0, 1) * 255).astype(np.uint8))
        out.append(
            ViewCamera(
                name=cam.name, width=int(cam.width), height=int(cam.height),
                fx=float(cam.K[0, 0]), fy=float(cam.K[1, 1]), cam_to_world=np.linalg.inv(w2c),
                image_path=Path(cam.image_path) if cam.image_path else None, thumbnail=thumb,
            )
        )  # fmt: skip
    return out


def make_thumbnail(rgb: np.ndarray, max_side: int = THUMBNAIL_MAX_SIDE) -> np.ndarray:
    """Shrink a uint8 RGB image so its longer side is at most `max_side` (area filter)."""
    h, w = rgb.shape[:2]
    factor = max_side / max(h, w)
    if factor >= 1.0:
        return np.ascontiguousarray(rgb)
    size = (max(1, round(w * factor)), max(1, round(h * factor)))
    return cv2.resize(rgb, size, interpolation=cv2.INTER_AREA)


def load_thumbnail(path: Path, max_side: int = THUMBNAIL_MAX_SIDE) -> Optional[np.ndarray]:
    """A small RGB copy of the image at `path`, or None when it cannot be read:
    thumbnails are a nicety, and a model must open without its training images."""
    # Decoding at 1/4 size is several times faster for JPEGs; fall back to full size
    # when the reduced image would be smaller than the thumbnail.
    bgr = cv2.imread(str(path), cv2.IMREAD_REDUCED_COLOR_4)
    if bgr is not None and max(bgr.shape[:2]) < max_side:
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if bgr is None:
        return None
    return make_thumbnail(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), max_side)


def find_image(image_dirs: Sequence[Path], img_name: str) -> Optional[Path]:
    """INRIA stores `img_name` without its extension; ours may keep it. Try both."""
    for folder in image_dirs:
        exact = folder / img_name
        if exact.is_file():
            return exact
        for suffix in IMAGE_SUFFIXES:
            candidate = folder / (img_name + suffix)
            if candidate.is_file():
                return candidate
    return None


def _camera_from_entry(entry: object, path: Path, index: int) -> ViewCamera:
    if not isinstance(entry, dict):
        raise InputError(f"{path}: entry {index} is not an object")
    try:
        rotation = np.asarray(entry["rotation"], dtype=np.float64)
        position = np.asarray(entry["position"], dtype=np.float64)
        width, height = int(entry["width"]), int(entry["height"])
        fx, fy = float(entry["fx"]), float(entry["fy"])
        name = str(entry.get("img_name", entry.get("id", index)))
    except KeyError as exc:
        raise InputError(f"{path}: camera entry {index} has no field {exc}") from None
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: camera entry {index} has a malformed value ({exc})") from None
    if rotation.shape != (3, 3) or position.shape != (3,):
        raise InputError(f"{path}: camera entry {index} needs a 3x3 'rotation' and a 3-vector 'position'")
    if width <= 0 or height <= 0 or fx <= 0 or fy <= 0:
        raise InputError(f"{path}: camera entry {index} has a non-positive width, height, fx or fy")
    if not (np.isfinite(rotation).all() and np.isfinite(position).all()):
        raise InputError(f"{path}: camera entry {index} has a non-finite pose")
    c2w = np.eye(4)
    c2w[:3, :3] = rotation
    c2w[:3, 3] = position
    return ViewCamera(name=name, width=width, height=height, fx=fx, fy=fy, cam_to_world=c2w)


def read_cameras_json(path: Path, image_dirs: Sequence[Path] = ()) -> List[ViewCamera]:
    """INRIA's cameras.json -> cameras, each with a thumbnail where its image is found."""
    path = Path(path)
    entries = read_json(path, expected=list)
    cameras = [_camera_from_entry(entry, path, i) for i, entry in enumerate(entries)]
    for cam in cameras:
        cam.image_path = find_image(image_dirs, cam.name)
        if cam.image_path is not None:
            cam.thumbnail = load_thumbnail(cam.image_path)
    return cameras
