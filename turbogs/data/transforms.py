"""Read transforms.json captures: NeRF-synthetic (Blender) and instant-ngp / nerfstudio.

Both store camera-to-world matrices in the OpenGL/Blender camera convention (x right,
y up, z backward). The scene convention is OpenCV (x right, y down, z forward), so the
camera's y and z axes are flipped before inverting to world-to-camera.

- NeRF-synthetic: `transforms_train.json` and `transforms_test.json` (`_val` is ignored),
  a shared `camera_angle_x`, and `file_path` usually without an extension (".png" is tried).
- instant-ngp / nerfstudio: one `transforms.json` with `fl_x fl_y cx cy w h` (or
  `camera_angle_x`), OpenCV distortion `k1 k2 p1 p2 [k3]`, any of which a frame may
  override, `file_path` relative to the json's folder, and an optional `ply_file_path`.

Frames whose image is missing are skipped and counted; the loader warns once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from turbogs.data.images import Intrinsics, ViewSpec, find_mask, is_file
from turbogs.errors import InputError
from turbogs.fileio import read_json

# OpenGL camera axes -> OpenCV camera axes: flip y and z.
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".PNG", ".JPG", ".JPEG")
UNSUPPORTED_CAMERA_MODELS = ("EQUIRECTANGULAR", "FISHEYE")


@dataclass
class FrameSet:
    """The views one file describes, plus the frames skipped for a missing image."""

    views: List[ViewSpec] = field(default_factory=list)
    missing: List[str] = field(default_factory=list)  # file_path values with no image
    source: Optional[Path] = None
    scene_box: Optional[np.ndarray] = None  # [2, 3] world min/max of instant-ngp's aabb, if declared


def _frames(data: Dict[str, Any], path: Path) -> List[Dict[str, Any]]:
    frames = data.get("frames")
    if not isinstance(frames, list):
        raise InputError(f"{path}: missing or invalid 'frames' list")
    for index, frame in enumerate(frames):
        if not isinstance(frame, dict):
            raise InputError(f"{path}: frame {index} is not a JSON object")
        if not isinstance(frame.get("file_path"), str):
            raise InputError(f"{path}: frame {index} has no 'file_path'")
    return frames


def gl_cam_to_world_to_cv_world_to_cam(frame: Dict[str, Any], index: int, path: Path) -> np.ndarray:
    """A frame's `transform_matrix` (OpenGL camera-to-world) -> OpenCV world-to-camera."""
    where = f"{path}: frame {index} ({frame.get('file_path')})"
    if "transform_matrix" not in frame:
        raise InputError(f"{where}: missing 'transform_matrix'")
    try:
        matrix = np.array(frame["transform_matrix"], dtype=np.float64)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer beyond float range
        raise InputError(f"{where}: 'transform_matrix' is not a matrix of numbers") from None
    if matrix.shape == (3, 4):
        matrix = np.vstack([matrix, [0.0, 0.0, 0.0, 1.0]])
    if matrix.shape != (4, 4):
        raise InputError(f"{where}: 'transform_matrix' has shape {matrix.shape}, expected 4x4")
    if not np.isfinite(matrix).all():
        raise InputError(f"{where}: 'transform_matrix' has NaN or infinite values")
    if abs(np.linalg.det(matrix[:3, :3])) < 1e-9 or not np.allclose(matrix[3], [0, 0, 0, 1]):
        raise InputError(f"{where}: 'transform_matrix' is singular or not a camera pose")
    return np.linalg.inv(matrix @ GL_TO_CV)


def resolve_image(base: Path, file_path: str) -> Optional[Path]:
    """The image a `file_path` names: as written, or with an image extension appended."""
    candidate = base / file_path
    if is_file(candidate):
        return candidate
    for suffix in IMAGE_SUFFIXES:
        with_suffix = candidate.with_name(candidate.name + suffix)
        if is_file(with_suffix):
            return with_suffix
    return None


def _relative_name(path: Path, base: Path) -> str:
    try:
        return path.relative_to(base).as_posix()
    except ValueError:  # an absolute file_path outside the scene folder
        return path.as_posix()


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{where}: '{key}' must be a finite number, got {value!r}")
    try:
        number = float(value)  # JSON integers are unbounded; beyond float range is OverflowError
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise InputError(f"{where}: '{key}' must be a finite number, got {str(value)[:20]}")
    return number


# --- NeRF-synthetic ------------------------------------------------------------------


def read_nerf_synthetic(scene: Path, split: str) -> Optional[FrameSet]:
    """Views of `transforms_<split>.json`, or None if that file does not exist."""
    path = scene / f"transforms_{split}.json"
    if not path.is_file():
        return None
    data = read_json(path)
    if "camera_angle_x" not in data:
        raise InputError(f"{path}: missing 'camera_angle_x'")
    fov_x = _number(data["camera_angle_x"], "camera_angle_x", str(path))
    if not 0 < fov_x < math.pi:
        raise InputError(f"{path}: 'camera_angle_x' must be between 0 and pi radians, got {fov_x}")
    result = FrameSet(source=path)
    for index, frame in enumerate(_frames(data, path)):
        world_to_cam = gl_cam_to_world_to_cv_world_to_cam(frame, index, path)
        image = resolve_image(scene, frame["file_path"])
        if image is None:
            result.missing.append(frame["file_path"])
            continue
        result.views.append(
            ViewSpec(
                name=_relative_name(image, scene),
                path=image,
                world_to_cam=world_to_cam,
                intrinsics=Intrinsics(fov_x=fov_x),
                composite_alpha=True,
            )
        )
    return result


# --- instant-ngp / nerfstudio --------------------------------------------------------


def _frame_intrinsics(data: Dict[str, Any], frame: Dict[str, Any], index: int, path: Path):
    """(Intrinsics, width, height, distortion or None, fisheye) with per-frame overrides.
    nerfstudio's OPENCV_FISHEYE keeps its k1..k4 in OpenCV's fisheye model; the pinhole
    models' k1 k2 p1 p2 [k3] are OpenCV's radial-tangential one."""
    where = f"{path}: frame {index} ({frame['file_path']})"

    def get(key: str) -> Optional[float]:
        value = frame.get(key, data.get(key))
        return None if value is None else _number(value, key, where)

    model = frame.get("camera_model", data.get("camera_model"))
    if model in UNSUPPORTED_CAMERA_MODELS or frame.get("is_fisheye", data.get("is_fisheye")):
        raise InputError(f"{where}: camera model {model or 'fisheye'} is not supported (use a pinhole or OPENCV capture)")

    width, height = get("w"), get("h")
    for key, value in (("w", width), ("h", height)):
        if value is not None and (value <= 0 or value != int(value)):
            raise InputError(f"{where}: '{key}' must be a positive integer, got {value}")
    fx, fy = get("fl_x"), get("fl_y")
    fov_x, fov_y = get("camera_angle_x"), get("camera_angle_y")
    if fx is None and fov_x is None:
        raise InputError(f"{where}: no focal length (expected 'fl_x' or 'camera_angle_x')")
    for key, value in (("fl_x", fx), ("fl_y", fy)):
        if value is not None and value <= 0:
            raise InputError(f"{where}: '{key}' must be positive, got {value}")
    for key, value in (("camera_angle_x", fov_x), ("camera_angle_y", fov_y)):
        if value is not None and not 0 < value < math.pi:
            raise InputError(f"{where}: '{key}' must be between 0 and pi radians, got {value}")
    if fx is None and width is not None:
        fx = 0.5 * width / math.tan(0.5 * fov_x)
    if fy is None and fov_y is not None and height is not None:
        fy = 0.5 * height / math.tan(0.5 * fov_y)
    if fy is None and fov_y is None:
        fy = fx  # square pixels unless told otherwise (None stays None: resolved from fov_x later)
    intrinsics = Intrinsics(fx=fx, fy=fy, cx=get("cx"), cy=get("cy"), fov_x=fov_x, fov_y=fov_y)

    fisheye = model == "OPENCV_FISHEYE"
    if fisheye:
        dist = np.array([get(k) or 0.0 for k in ("k1", "k2", "k3", "k4")])
    else:
        coefficients = [get(k) or 0.0 for k in ("k1", "k2", "p1", "p2", "k3")]
        dist = np.array(coefficients if coefficients[4] else coefficients[:4])
        if not dist.any():
            dist = None
    if (dist is not None) and (width is None or height is None):
        raise InputError(f"{where}: {'a fisheye camera' if fisheye else 'distortion'} needs the image size 'w' and 'h'")
    size = (None, None) if width is None or height is None else (int(width), int(height))
    return intrinsics, size[0], size[1], dist, fisheye


def read_nerfstudio(scene: Path, images: str = "images") -> Tuple[FrameSet, Optional[Path]]:
    """Views of `transforms.json` and the path of its point cloud (None if not given).

    A frame under `<images>/` gets that folder recorded, so that `<images>_N/` copies and
    the `masks/` folder beside it are found as for COLMAP.
    """
    path = scene / "transforms.json"
    data = read_json(path)
    result = FrameSet(source=path)
    for index, frame in enumerate(_frames(data, path)):
        world_to_cam = gl_cam_to_world_to_cv_world_to_cam(frame, index, path)
        intrinsics, width, height, dist, fisheye = _frame_intrinsics(data, frame, index, path)
        image = resolve_image(scene, frame["file_path"])
        if image is None:
            result.missing.append(frame["file_path"])
            continue
        name = _relative_name(image, scene)
        folder, rel = None, name
        parts = Path(name).parts
        if len(parts) > 1 and parts[0] == images:
            folder, rel = scene / images, Path(*parts[1:]).as_posix()
        mask_path = None
        if isinstance(frame.get("mask_path"), str):
            mask_path = scene / frame["mask_path"]
            if not is_file(mask_path):
                raise InputError(f"{path}: frame {index}: mask {mask_path} not found")
        elif folder is not None:
            mask_path = find_mask(folder.parent / "masks", rel)
        result.views.append(
            ViewSpec(
                name=name,
                path=image,
                world_to_cam=world_to_cam,
                intrinsics=intrinsics,
                width=width,
                height=height,
                dist=dist,
                fisheye=fisheye,
                folder=folder,
                rel=rel,
                mask_path=mask_path,
            )
        )
    result.scene_box = ngp_scene_box(data, path)
    ply = data.get("ply_file_path")
    return result, (scene / ply if isinstance(ply, str) else None)


NGP_DEFAULT_SCALE, NGP_DEFAULT_OFFSET = 0.33, (0.5, 0.5, 0.5)  # instant-ngp's NerfDataset defaults


def ngp_scene_box(data: Dict[str, Any], path: Path) -> Optional[np.ndarray]:
    """The world-space box instant-ngp trains inside, when the file declares one of
    `aabb_scale`, `scale`, `offset` ([2, 3] min and max), else None.

    instant-ngp maps a camera position x to x * scale + offset and trains inside the cube
    of side aabb_scale centred on (0.5, 0.5, 0.5) (its axis cycling leaves that cube as is),
    so in the file's own coordinates the box is centred on (0.5 - offset) / scale with
    half-side aabb_scale / (2 * scale)."""
    if not any(key in data for key in ("aabb_scale", "scale", "offset")):
        return None
    where = str(path)
    aabb_scale = _number(data.get("aabb_scale", 1), "aabb_scale", where)
    scale = _number(data.get("scale", NGP_DEFAULT_SCALE), "scale", where)
    offset = data.get("offset", NGP_DEFAULT_OFFSET)
    if not isinstance(offset, (list, tuple)) or len(offset) != 3:
        raise InputError(f"{where}: 'offset' must be a list of 3 numbers, got {offset!r}")
    offset = np.array([_number(v, "offset", where) for v in offset])
    if aabb_scale <= 0 or scale <= 0:
        raise InputError(f"{where}: 'aabb_scale' and 'scale' must be positive, got {aabb_scale} and {scale}")
    center, half = (0.5 - offset) / scale, aabb_scale / (2 * scale)
    return np.stack([center - half, center + half])


def read_ply_points(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    """(xyz float32 [P, 3], rgb float32 [P, 3] in [0, 1]) from a point-cloud .ply.
    Points without color get mid-gray."""
    from plyfile import PlyData

    try:
        vertex = PlyData.read(str(path))["vertex"]
        xyz = np.stack([np.asarray(vertex[k], dtype=np.float64) for k in ("x", "y", "z")], axis=1)
        names = vertex.data.dtype.names
    except Exception as e:  # plyfile raises many types for bad files
        raise InputError(f"{path}: cannot read point cloud ({e})") from None
    if all(k in names for k in ("red", "green", "blue")):
        raw = np.stack([np.asarray(vertex[k]) for k in ("red", "green", "blue")], axis=1)
        rgb = raw / 255.0 if np.issubdtype(raw.dtype, np.integer) else np.clip(raw, 0.0, 1.0)
    else:
        rgb = np.full_like(xyz, 0.5)
    finite = np.isfinite(xyz).all(axis=1)
    return xyz[finite].astype(np.float32), rgb[finite].astype(np.float32)
