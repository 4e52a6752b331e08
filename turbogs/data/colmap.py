"""Read a COLMAP sparse model (cameras, images, points3D) in binary or text form.

The layouts are the ones COLMAP itself writes (`colmap model_converter`):

- cameras.bin:  u64 count, then per camera: i32 id, i32 model id, u64 width, u64 height,
  f64 params[model's count].
- images.bin:   u64 count, then per image: i32 id, f64 qw qx qy qz, f64 tx ty tz, i32 camera
  id, a NUL-terminated name, u64 number of 2D points, then that many (f64 x, f64 y, i64 id).
- points3D.bin: u64 count, then per point: u64 id, f64 x y z, u8 r g b, f64 error,
  u64 track length, then that many (i32 image id, i32 point2D index).
- The .txt files hold the same fields, one record per line (images take two lines: the
  pose line and a line of 2D points, which may be empty); `#` starts a comment.

Every count in a file is untrusted: it is checked against the bytes that remain before
anything is allocated from it, and a file that ends early or has bytes left over is an
`InputError` naming the file, never a `struct.error`. The pose (qvec, tvec) is COLMAP's
world-to-camera transform, already in the OpenCV camera convention.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from turbogs.errors import InputError
from turbogs.geometry import quat_to_rotmat

# COLMAP's model ids, names and parameter counts (src/colmap/sensor/models.h).
CAMERA_MODELS: Dict[int, Tuple[str, int]] = {
    0: ("SIMPLE_PINHOLE", 3),
    1: ("PINHOLE", 4),
    2: ("SIMPLE_RADIAL", 4),
    3: ("RADIAL", 5),
    4: ("OPENCV", 8),
    5: ("OPENCV_FISHEYE", 8),
    6: ("FULL_OPENCV", 12),
    7: ("FOV", 5),
    8: ("SIMPLE_RADIAL_FISHEYE", 4),
    9: ("RADIAL_FISHEYE", 5),
    10: ("THIN_PRISM_FISHEYE", 12),
    11: ("RAD_TAN_THIN_PRISM_FISHEYE", 16),
}
MODEL_IDS: Dict[str, int] = {name: model_id for model_id, (name, _) in CAMERA_MODELS.items()}

# The models TurboGS can turn into a pinhole camera (all but the first two by undistorting).
# The fisheye ones are OpenCV's fisheye model (theta_d = theta (1 + k1 theta^2 + ... + k4 theta^8),
# theta the angle from the optical axis) with fewer coefficients: COLMAP's models.h defines
# SIMPLE_RADIAL_FISHEYE as k1 alone and RADIAL_FISHEYE as k1, k2.
FISHEYE_MODELS = ("OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")
SUPPORTED_MODELS = ("SIMPLE_PINHOLE", "PINHOLE", "SIMPLE_RADIAL", "RADIAL", "OPENCV") + FISHEYE_MODELS


@dataclass
class ColmapCamera:
    camera_id: int
    model: str
    width: int
    height: int
    params: np.ndarray  # float64, the model's parameters in COLMAP's order


@dataclass
class ColmapImage:
    image_id: int
    qvec: np.ndarray  # float64 [4] qw qx qy qz, world-to-camera rotation
    tvec: np.ndarray  # float64 [3], world-to-camera translation
    camera_id: int
    name: str  # relative to the images folder; may contain subfolders


@dataclass
class ColmapModel:
    cameras: Dict[int, ColmapCamera]
    images: List[ColmapImage]
    points: Optional[np.ndarray]  # float64 [P, 3], or None when there is no points3D file
    colors: Optional[np.ndarray]  # uint8 [P, 3]
    folder: Path


# --- geometry ------------------------------------------------------------------------


def world_to_cam(image: ColmapImage) -> np.ndarray:
    """4x4 float64 world-to-camera matrix of a COLMAP image."""
    m = np.eye(4)
    m[:3, :3] = quat_to_rotmat(image.qvec)
    m[:3, 3] = image.tvec
    return m


# --- binary files --------------------------------------------------------------------


class _Reader:
    """Sequential little-endian reads from a byte string that fail as InputError."""

    def __init__(self, data: bytes, path: Path):
        self.data = data
        self.path = path
        self.pos = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.pos

    def fail(self, what: str) -> InputError:
        return InputError(f"{self.path}: {what} (file truncated or corrupt)")

    def unpack(self, fmt: str, what: str) -> tuple:
        size = struct.calcsize(fmt)
        if size > self.remaining:
            raise self.fail(f"unexpected end of file while reading {what}")
        values = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return values

    def skip(self, nbytes: int, what: str) -> None:
        if nbytes > self.remaining:
            raise self.fail(f"unexpected end of file while reading {what}")
        self.pos += nbytes

    def cstring(self, what: str) -> str:
        end = self.data.find(b"\x00", self.pos)
        if end < 0:
            raise self.fail(f"unterminated {what}")
        raw = self.data[self.pos : end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not valid UTF-8") from None

    def count(self, min_record_bytes: int, what: str) -> int:
        """Read a u64 record count and check it can fit in what is left of the file."""
        (n,) = self.unpack("<Q", f"number of {what}")
        if n * min_record_bytes > self.remaining:
            raise self.fail(
                f"says it holds {n} {what} but only {self.remaining} bytes follow"
            )
        return n

    def expect_end(self, what: str) -> None:
        if self.remaining:
            raise InputError(
                f"{self.path}: {self.remaining} bytes left over after the declared {what} "
                "(wrong count or corrupt file)"
            )


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from e


def read_cameras_bin(path: Path) -> Dict[int, ColmapCamera]:
    r = _Reader(_read_bytes(path), path)
    n = r.count(24, "cameras")
    cameras: Dict[int, ColmapCamera] = {}
    for _ in range(n):
        camera_id, model_id, width, height = r.unpack("<iiQQ", "a camera header")
        if model_id not in CAMERA_MODELS:
            raise InputError(f"{path}: camera {camera_id} has unknown camera model id {model_id}")
        model, num_params = CAMERA_MODELS[model_id]
        params = np.array(r.unpack(f"<{num_params}d", f"camera {camera_id}'s parameters"))
        cameras[camera_id] = ColmapCamera(camera_id, model, int(width), int(height), params)
    r.expect_end("cameras")
    return cameras


def read_images_bin(path: Path) -> List[ColmapImage]:
    r = _Reader(_read_bytes(path), path)
    # Smallest record: id, qvec, tvec, camera id, a 1-byte name terminator, point count.
    n = r.count(4 + 32 + 24 + 4 + 1 + 8, "images")
    images = []
    for _ in range(n):
        values = r.unpack("<i4d3di", "an image header")
        image_id = values[0]
        name = r.cstring(f"name of image {image_id}")
        (num_points2d,) = r.unpack("<Q", f"point count of image {name!r}")
        r.skip(num_points2d * 24, f"2D points of image {name!r}")
        images.append(
            ColmapImage(image_id, np.array(values[1:5]), np.array(values[5:8]), values[8], name)
        )
    r.expect_end("images")
    return images


def read_points3d_bin(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    r = _Reader(_read_bytes(path), path)
    record = struct.Struct("<Q3d3BdQ")  # id, xyz, rgb, error, track length (51 bytes)
    n = r.count(record.size, "points")
    xyz = np.empty((n, 3), dtype=np.float64)
    rgb = np.empty((n, 3), dtype=np.uint8)
    data, pos, end = r.data, r.pos, len(r.data)
    for i in range(n):
        if pos + record.size > end:
            r.pos = pos
            raise r.fail(f"unexpected end of file in point {i}")
        _, x, y, z, red, green, blue, _, track_length = record.unpack_from(data, pos)
        pos += record.size + 8 * track_length  # the track is (i32 image id, i32 index) pairs
        xyz[i] = (x, y, z)
        rgb[i] = (red, green, blue)
    if pos > end:
        r.pos = end
        raise r.fail("unexpected end of file in the track of the last point")
    r.pos = pos
    r.expect_end("points")
    return xyz, rgb


# --- text files ----------------------------------------------------------------------


def _read_text_lines(path: Path) -> List[str]:
    """The file's lines without comments; blank lines are kept (images.txt needs them)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from e
    return [line.strip() for line in text.splitlines() if not line.lstrip().startswith("#")]


def _numbers(fields: List[str], path: Path, line_no: int, kind=float) -> list:
    try:
        return [kind(f) for f in fields]
    except ValueError:
        raise InputError(f"{path}: line {line_no}: expected numbers, got {' '.join(fields)!r}") from None


def read_cameras_txt(path: Path) -> Dict[int, ColmapCamera]:
    cameras: Dict[int, ColmapCamera] = {}
    for line_no, line in enumerate(_read_text_lines(path), 1):
        if not line:
            continue
        fields = line.split()
        if len(fields) < 4:
            raise InputError(f"{path}: camera line {line_no} has {len(fields)} fields, expected at least 4")
        camera_id, width, height = _numbers([fields[0], fields[2], fields[3]], path, line_no, int)
        model = fields[1]
        if model not in MODEL_IDS:
            raise InputError(f"{path}: camera {camera_id} has unknown camera model {model}")
        num_params = CAMERA_MODELS[MODEL_IDS[model]][1]
        if len(fields) - 4 != num_params:
            raise InputError(
                f"{path}: camera {camera_id} ({model}) has {len(fields) - 4} parameters, expected {num_params}"
            )
        params = np.array(_numbers(fields[4:], path, line_no))
        cameras[camera_id] = ColmapCamera(camera_id, model, width, height, params)
    return cameras


def read_images_txt(path: Path) -> List[ColmapImage]:
    lines = _read_text_lines(path)
    images = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        fields = line.split(maxsplit=9)
        if len(fields) < 10:
            raise InputError(f"{path}: image line {i + 1} has {len(fields)} fields, expected 10")
        image_id, camera_id = _numbers([fields[0], fields[8]], path, i + 1, int)
        pose = _numbers(fields[1:8], path, i + 1)
        images.append(ColmapImage(image_id, np.array(pose[:4]), np.array(pose[4:]), camera_id, fields[9]))
        i += 2  # the next line lists the image's 2D points (possibly empty); not needed
    return images


def read_points3d_txt(path: Path) -> Tuple[np.ndarray, np.ndarray]:
    xyz, rgb = [], []
    for line_no, line in enumerate(_read_text_lines(path), 1):
        if not line:
            continue
        fields = line.split()
        if len(fields) < 8:
            raise InputError(f"{path}: point line {line_no} has {len(fields)} fields, expected at least 8")
        xyz.append(_numbers(fields[1:4], path, line_no))
        color = _numbers(fields[4:7], path, line_no, int)
        if not all(0 <= c <= 255 for c in color):  # checked here: a huge int would overflow numpy
            raise InputError(f"{path}: line {line_no}: point colors must be in 0..255, got {color}")
        rgb.append(color)
    xyz_array = np.array(xyz, dtype=np.float64).reshape(-1, 3)
    return xyz_array, np.array(rgb, dtype=np.uint8).reshape(-1, 3)


# --- the model -----------------------------------------------------------------------


def find_model_folder(scene: Path) -> Optional[Path]:
    """`sparse/0/` or `sparse/`, whichever holds a cameras file first; None if neither."""
    for folder in (scene / "sparse" / "0", scene / "sparse"):
        if (folder / "cameras.bin").is_file() or (folder / "cameras.txt").is_file():
            return folder
    return None


def _pick(folder: Path, stem: str) -> Optional[Path]:
    """The binary file if present, else the text file, else None."""
    for suffix in (".bin", ".txt"):
        if (folder / f"{stem}{suffix}").is_file():
            return folder / f"{stem}{suffix}"
    return None


def read_model(folder: Path) -> ColmapModel:
    """Read cameras, images and (if present) points3D from one model folder, and check
    that the model is consistent: finite values, unique names, known camera ids."""
    folder = Path(folder)
    cameras_path = _pick(folder, "cameras")
    images_path = _pick(folder, "images")
    for stem, found in (("cameras", cameras_path), ("images", images_path)):
        if found is None:
            raise InputError(f"{folder}: COLMAP model has no {stem}.bin or {stem}.txt")
    if cameras_path.suffix == ".bin":
        cameras = read_cameras_bin(cameras_path)
    else:
        cameras = read_cameras_txt(cameras_path)
    images = read_images_bin(images_path) if images_path.suffix == ".bin" else read_images_txt(images_path)

    points = colors = None
    points_path = _pick(folder, "points3D")
    if points_path is not None:
        reader = read_points3d_bin if points_path.suffix == ".bin" else read_points3d_txt
        points, colors = reader(points_path)
        finite = np.isfinite(points).all(axis=1)
        points, colors = points[finite], colors[finite]  # a NaN point is dropped, not fatal

    _validate(cameras, images, cameras_path, images_path)
    return ColmapModel(cameras, images, points, colors, folder)


def _validate(cameras: Dict[int, ColmapCamera], images: List[ColmapImage], cameras_path: Path, images_path: Path):
    if not images:
        raise InputError(f"{images_path}: the COLMAP model has no images")
    first_user: Dict[int, str] = {}  # camera id -> an image that uses it, for messages
    names = set()
    for image in images:
        if image.name in names:
            raise InputError(f"{images_path}: image name {image.name!r} appears more than once")
        names.add(image.name)
        if not (np.isfinite(image.qvec).all() and np.isfinite(image.tvec).all()):
            raise InputError(f"{images_path}: image {image.name!r} has a NaN or infinite pose")
        if not np.linalg.norm(image.qvec) > 1e-12:
            raise InputError(f"{images_path}: image {image.name!r} has a zero rotation quaternion")
        if image.camera_id not in cameras:
            raise InputError(f"{images_path}: image {image.name!r} uses camera {image.camera_id}, which is not in {cameras_path}")
        first_user.setdefault(image.camera_id, image.name)
    for camera_id in sorted(first_user):
        camera = cameras[camera_id]
        where = f"{cameras_path}: camera {camera_id} (of image {first_user[camera_id]!r})"
        if camera.model not in SUPPORTED_MODELS:
            raise InputError(
                f"{cameras_path}: camera {camera_id} uses the {camera.model} model, which is not supported "
                f"(supported: {', '.join(SUPPORTED_MODELS)}; undistort with `colmap image_undistorter`)"
            )
        if not np.isfinite(camera.params).all():
            raise InputError(f"{where} has NaN or infinite intrinsics")
        if camera.width <= 0 or camera.height <= 0:
            raise InputError(f"{where} has size {camera.width}x{camera.height}")
        focal = camera.params[:2] if camera.model in ("PINHOLE", "OPENCV", "OPENCV_FISHEYE") else camera.params[:1]
        if not (focal > 0).all():
            raise InputError(f"{where} has a non-positive focal length")


def intrinsics(camera: ColmapCamera) -> Tuple[np.ndarray, np.ndarray]:
    """(K [3, 3], distortion) in COLMAP's pixel convention (pixel centers at +0.5). The
    distortion is OpenCV's [k1, k2, p1, p2] (all zeros for the pinhole models), or for the
    FISHEYE_MODELS OpenCV's fisheye [k1, k2, k3, k4]."""
    p = camera.params
    dist = np.zeros(4)
    if camera.model == "SIMPLE_PINHOLE":
        fx = fy = p[0]
        cx, cy = p[1], p[2]
    elif camera.model == "PINHOLE":
        fx, fy, cx, cy = p
    elif camera.model == "SIMPLE_RADIAL":
        fx = fy = p[0]
        cx, cy = p[1], p[2]
        dist[0] = p[3]
    elif camera.model == "RADIAL":
        fx = fy = p[0]
        cx, cy = p[1], p[2]
        dist[:2] = p[3:5]
    elif camera.model in ("OPENCV", "OPENCV_FISHEYE"):
        fx, fy, cx, cy = p[:4]
        dist[:] = p[4:8]
    elif camera.model in ("SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE"):
        fx = fy = p[0]
        cx, cy = p[1], p[2]
        dist[: len(p) - 3] = p[3:]
    else:  # _validate rejects these before we get here
        raise InputError(f"camera {camera.camera_id}: unsupported model {camera.model}")
    K = np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])
    return K, dist
