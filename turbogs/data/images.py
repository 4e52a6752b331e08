"""Pixels in: read, downscale (with a PNG cache), undistort, alpha and masks.

Everything here works on numpy arrays straight from OpenCV and is independent of the
scene format; `load.py` decides *which* file to read and at what size.
"""

from __future__ import annotations

import hashlib
import math
import os
import stat
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import cv2
import numpy as np

from turbogs.errors import InputError, TurboGSError
from turbogs.fileio import atomic_path

# A corrupt image is reported once, by us, in one line; OpenCV's own C++ log would add more.
cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)

MASK_SUFFIXES = (".png", ".jpg", ".jpeg")


# --- what to load --------------------------------------------------------------------


@dataclass
class Intrinsics:
    """Pinhole intrinsics in pixels at the original image size (pixel centers at +0.5).

    Formats that give a field of view instead of a focal length, or that omit the
    principal point, leave those fields None; they are resolved from the image size.
    """

    fx: Optional[float] = None
    fy: Optional[float] = None
    cx: Optional[float] = None
    cy: Optional[float] = None
    fov_x: Optional[float] = None  # radians, used when fx is None
    fov_y: Optional[float] = None  # radians, used when fy is None (else fy = fx)

    def matrix(self, width: int, height: int) -> np.ndarray:
        fx = self.fx if self.fx is not None else 0.5 * width / math.tan(0.5 * self.fov_x)
        if self.fy is not None:
            fy = self.fy
        elif self.fov_y is not None:
            fy = 0.5 * height / math.tan(0.5 * self.fov_y)
        else:
            fy = fx
        cx = self.cx if self.cx is not None else 0.5 * width
        cy = self.cy if self.cy is not None else 0.5 * height
        return np.array([[fx, 0.0, cx], [0.0, fy, cy], [0.0, 0.0, 1.0]])


@dataclass
class ViewSpec:
    """One view as a scene file describes it, before its pixels are read."""

    name: str  # unique, decides the split order
    path: Path  # the full-resolution image file
    world_to_cam: np.ndarray  # [4, 4] float64, OpenCV convention
    intrinsics: Intrinsics
    width: Optional[int] = None  # the size the intrinsics refer to; None = the image's size
    height: Optional[int] = None
    dist: Optional[np.ndarray] = None  # OpenCV k1 k2 p1 p2 [k3]; None or zeros = pinhole
    fisheye: bool = False  # True: `dist` is OpenCV's fisheye k1 k2 k3 k4 (equidistant even when all zero)
    folder: Optional[Path] = None  # images folder that has `<folder>_N` siblings, if any
    rel: str = ""  # path of the image inside `folder`
    mask_path: Optional[Path] = None
    composite_alpha: bool = False  # True: blend RGBA onto the background; False: alpha -> mask

    def downscaled_path(self, factor: int) -> Optional[Path]:
        """Where a pre-downscaled copy (`images_N/`) would be."""
        if self.folder is None:
            return None
        return self.folder.with_name(f"{self.folder.name}_{factor}") / self.rel


# --- reading -------------------------------------------------------------------------


def is_file(path: Path) -> bool:
    """`Path.is_file`, but False (not OSError) for a name the OS refuses, such as one too
    long: names come from scene files, and a garbled one means "no such image"."""
    try:
        return Path(path).is_file()
    except OSError:
        return False


def read_raw(path: Path) -> np.ndarray:
    """The file's pixels exactly as stored: uint8/uint16/float, 1, 3 or 4 channels
    (OpenCV order: BGR/BGRA). Unreadable or corrupt files are an InputError."""
    data = cv2.imread(str(path), cv2.IMREAD_UNCHANGED) if is_file(path) else None
    if data is None or data.size == 0:
        raise InputError(f"cannot read image {path}: missing, corrupt or not an image")
    return data


def to_float(raw: np.ndarray) -> np.ndarray:
    """Stored values -> float32 in [0, 1], using the full range of the integer type
    (so 16-bit images are divided by 65535, not 255)."""
    if raw.dtype == np.uint8:
        return raw.astype(np.float32) / np.float32(255.0)
    if raw.dtype == np.uint16:
        return raw.astype(np.float32) / np.float32(65535.0)
    return np.clip(raw.astype(np.float32), 0.0, 1.0)


def split_rgb_alpha(raw: np.ndarray) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Stored pixels -> (RGB float32 [H, W, 3], alpha float32 [H, W] or None).
    Grayscale is replicated to three channels; gray+alpha is handled too."""
    pixels = to_float(raw)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    channels = pixels.shape[2]
    alpha = None
    if channels in (2, 4):
        alpha = np.ascontiguousarray(pixels[:, :, -1])
        pixels = pixels[:, :, :-1]
    if pixels.shape[2] == 1:
        rgb = np.repeat(pixels, 3, axis=2)
    else:
        rgb = pixels[:, :, ::-1]  # BGR -> RGB
    return np.ascontiguousarray(rgb), alpha


def image_size(raw: np.ndarray) -> Tuple[int, int]:
    """(width, height) of an image array."""
    return raw.shape[1], raw.shape[0]


# --- resizing and the cache ----------------------------------------------------------


def resize(raw: np.ndarray, size: Tuple[int, int]) -> np.ndarray:
    """Resize to (width, height): area averaging when shrinking (no aliasing),
    bilinear when enlarging."""
    if image_size(raw) == tuple(size):
        return raw
    shrinking = size[0] < raw.shape[1]
    return cv2.resize(raw, tuple(size), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)


def _folder_is_writable(folder: Path) -> bool:
    """Writable by us *and* meant to be written: a folder without write bits counts as
    read-only even for root, so that shared, read-only captures stay untouched."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        mode = probe.stat().st_mode
    except OSError:
        return False
    return stat.S_ISDIR(mode) and bool(mode & 0o222) and os.access(probe, os.W_OK)


class DownscaleCache:
    """Downscaled copies of source images, stored as PNG so they keep full precision
    (16-bit stays 16-bit, alpha stays alpha).

    The cache never makes loading fail: if the wanted folder cannot be written, a folder
    under the system temp dir is used; if that fails too, caching is off. Nothing is
    created until the first image is stored. A cached file is used only if it is newer
    than its source and has the expected size.
    """

    def __init__(self, folder: Optional[Path], log=print):
        self.log = log
        self.wanted = None if folder is None else Path(folder)
        self.folder: Optional[Path] = None
        self._lock = threading.Lock()
        self._ready = False  # the folder exists (or caching is off)
        if self.wanted is None:
            return
        digest = hashlib.sha1(str(self.wanted.resolve()).encode()).hexdigest()[:12]
        fallback = Path(tempfile.gettempdir()) / "turbogs_cache" / digest
        self.folder = next((c for c in (self.wanted, fallback) if _folder_is_writable(c)), None)

    def path_for(self, key: str) -> Optional[Path]:
        """`<folder>/<key>.png`; the key's absolute or `..` parts are dropped so that the
        file always lands inside the cache folder."""
        if self.folder is None:
            return None
        parts = [p for p in Path(key).parts if p not in ("..", ".") and p != Path(key).anchor]
        return self.folder / (Path(*parts).as_posix() + ".png")

    def get(self, key: str, source: Path, size: Tuple[int, int]) -> Optional[np.ndarray]:
        cached = self.path_for(key)
        if cached is None or not is_file(cached):
            return None
        try:
            if cached.stat().st_mtime < Path(source).stat().st_mtime:
                return None
        except OSError:
            return None
        data = cv2.imread(str(cached), cv2.IMREAD_UNCHANGED)
        if data is None or image_size(data) != tuple(size):
            return None
        return data

    def _prepare(self) -> None:
        """Create the folder on first use and say where the cache went, once."""
        with self._lock:
            if self._ready:
                return
            self._ready = True
            if self.folder is not None:
                try:
                    self.folder.mkdir(parents=True, exist_ok=True)
                except OSError:
                    self.folder = None
            if self.wanted is not None and self.folder != self.wanted:
                where = f"caching downscaled images in {self.folder}" if self.folder else "not caching downscaled images"
                self.log(f"cache folder {self.wanted} is not writable; {where}")

    def put(self, key: str, data: np.ndarray) -> None:
        self._prepare()
        cached = self.path_for(key)
        if cached is None:
            return
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            with atomic_path(cached) as tmp:
                if not cv2.imwrite(str(tmp), data):
                    raise OSError("cv2.imwrite failed")
        except (OSError, TurboGSError) as e:
            with self._lock:
                if self.folder is not None:
                    self.log(f"could not write to the image cache {self.folder} ({e}); continuing without it")
                self.folder = None


# --- undistortion --------------------------------------------------------------------


@dataclass
class Undistortion:
    """Everything needed to undistort images of one camera at one size."""

    K: np.ndarray  # new pinhole K after the crop, pixel centers at +0.5
    map_x: np.ndarray
    map_y: np.ndarray
    roi: Tuple[int, int, int, int]  # x, y, width, height of the valid region

    @property
    def size(self) -> Tuple[int, int]:
        return self.roi[2], self.roi[3]

    def apply(self, image: np.ndarray, interpolation=cv2.INTER_LINEAR) -> np.ndarray:
        x, y, w, h = self.roi
        out = cv2.remap(image, self.map_x, self.map_y, interpolation, borderMode=cv2.BORDER_CONSTANT)
        return np.ascontiguousarray(out[y : y + h, x : x + w])


def has_distortion(dist: Optional[np.ndarray]) -> bool:
    return dist is not None and bool(np.any(np.asarray(dist) != 0))


def make_undistortion(K: np.ndarray, dist: Sequence[float], size: Tuple[int, int], fisheye: bool = False) -> Undistortion:
    """OpenCV undistortion that keeps only valid pixels (alpha=0), cropped to the valid ROI.

    K uses the COLMAP/scene convention (pixel centers at +0.5); OpenCV puts centers at
    integer coordinates, so the principal point is shifted by half a pixel going in and
    coming back out. Distortion coefficients are in normalised coordinates and do not
    depend on the image size. `fisheye`: `dist` is OpenCV's (and COLMAP's) fisheye model,
    theta_d = theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8).
    """
    w, h = size
    K_cv = np.array(K, dtype=np.float64)
    K_cv[0, 2] -= 0.5
    K_cv[1, 2] -= 0.5
    dist = np.asarray(dist, dtype=np.float64)
    if fisheye:
        return _fisheye_undistortion(K_cv, dist, (w, h))
    new_K, roi = cv2.getOptimalNewCameraMatrix(K_cv, dist, (w, h), 0.0, (w, h))
    x, y, rw, rh = (int(v) for v in roi)
    if rw <= 0 or rh <= 0:  # extreme distortion; keep the full frame rather than nothing
        x, y, rw, rh = 0, 0, w, h
    map_x, map_y = cv2.initUndistortRectifyMap(K_cv, dist, None, new_K, (w, h), cv2.CV_32FC1)
    return _with_roi(new_K, map_x, map_y, (x, y, rw, rh))


def _with_roi(new_K: np.ndarray, map_x: np.ndarray, map_y: np.ndarray, roi) -> Undistortion:
    """The Undistortion whose K is `new_K` (OpenCV centres) moved to the crop, centres at +0.5."""
    x, y = roi[0], roi[1]
    out_K = np.array(new_K, dtype=np.float64)
    out_K[0, 2] += 0.5 - x
    out_K[1, 2] += 0.5 - y
    return Undistortion(out_K, map_x, map_y, tuple(int(v) for v in roi))


def _fisheye_undistortion(K_cv: np.ndarray, dist: np.ndarray, size: Tuple[int, int]) -> Undistortion:
    """The same crop rule as `cv2.getOptimalNewCameraMatrix(alpha=0)`, for the fisheye model,
    which OpenCV's fisheye module lacks (its `balance` scales the focal length instead):
    undistort a 9x9 grid over the image, take the rectangle inside the undistorted left,
    right, top and bottom edges, and map it onto the whole output. A last check trims any
    border row or column whose source lies outside the image, so every kept pixel is real."""
    w, h = size
    if dist.shape != (4,):
        raise InputError(f"a fisheye camera needs 4 distortion coefficients (k1 k2 k3 k4), got {dist.tolist()}")
    xs, ys = np.linspace(0.0, w - 1.0, 9), np.linspace(0.0, h - 1.0, 9)
    grid = np.stack(np.meshgrid(xs, ys), axis=-1).reshape(-1, 1, 2)
    flat = cv2.fisheye.undistortPoints(grid, K_cv, dist)
    # Beyond 90 degrees off axis (or where the coefficients fold the image) a pixel has no pinhole
    # ray, yet OpenCV returns some number: each point is distorted back, and those that do not
    # return are left out (a corner of a very wide lens; the trim below keeps its region out).
    back = cv2.fisheye.distortPoints(np.nan_to_num(flat), K_cv, dist)
    ok = (np.abs(back - grid).max(axis=2) < 0.05).reshape(9, 9) & np.isfinite(flat).all(axis=2).reshape(9, 9)
    flat = flat.reshape(9, 9, 2)
    sides = [(flat[:, 0, 0], ok[:, 0]), (flat[:, -1, 0], ok[:, -1]), (flat[0, :, 1], ok[0]), (flat[-1, :, 1], ok[-1])]
    if any(good.sum() < 3 for _, good in sides):
        left = right = top = bottom = 0.0
    else:
        (left, right, top, bottom) = (values[good].max() if i in (0, 2) else values[good].min()
                                      for i, (values, good) in enumerate(sides))
    if not (right > left and bottom > top):
        raise InputError(f"fisheye camera (K {K_cv.round(3).tolist()}, k {dist.tolist()}): its field of view "
                         "cannot be undistorted to a pinhole image (too wide, or coefficients that fold the image)")
    fx, fy = (w - 1.0) / (right - left), (h - 1.0) / (bottom - top)
    new_K = np.array([[fx, 0.0, -fx * left], [0.0, fy, -fy * top], [0.0, 0.0, 1.0]])
    map_x, map_y = cv2.fisheye.initUndistortRectifyMap(K_cv, dist, np.eye(3), new_K, (w, h), cv2.CV_32FC1)
    inside = (map_x >= -0.01) & (map_x <= w - 0.99) & (map_y >= -0.01) & (map_y <= h - 0.99)  # no blend with black
    x0, y0, x1, y1 = 0, 0, w, h
    while x1 - x0 > 1 and y1 - y0 > 1 and not inside[y0:y1, x0:x1].all():
        box = inside[y0:y1, x0:x1]
        # drop the border line with the most pixels outside
        worst = int(np.argmax([(~box[:, 0]).sum(), (~box[:, -1]).sum(), (~box[0]).sum(), (~box[-1]).sum()]))
        x0, x1, y0, y1 = x0 + (worst == 0), x1 - (worst == 1), y0 + (worst == 2), y1 - (worst == 3)
    return _with_roi(new_K, map_x, map_y, (x0, y0, x1 - x0, y1 - y0))


class UndistortionCache:
    """One undistortion map per (intrinsics, distortion, size): computing a map costs as
    much as undistorting several images, and most captures share one camera."""

    def __init__(self):
        self._maps: Dict[bytes, Undistortion] = {}
        self._lock = threading.Lock()

    def get(self, K: np.ndarray, dist: np.ndarray, size: Tuple[int, int], fisheye: bool = False) -> Undistortion:
        key = (np.asarray(K, np.float64).tobytes() + np.asarray(dist, np.float64).tobytes()
               + bytes(f"{size}{fisheye}", "ascii"))
        with self._lock:
            found = self._maps.get(key)
        if found is None:
            found = make_undistortion(K, dist, size, fisheye)
            with self._lock:
                self._maps[key] = found
        return found


# --- masks ---------------------------------------------------------------------------


def find_mask(masks_dir: Path, name: str) -> Optional[Path]:
    """The mask file for image `name` (relative, may include subfolders): same stem with
    .png/.jpg/.jpeg, or the full name plus .png. None if there is none."""
    if not masks_dir.is_dir():
        return None
    rel = Path(name)
    candidates = [rel.with_suffix(s) for s in MASK_SUFFIXES] + [Path(str(rel) + ".png")]
    for candidate in candidates:
        if is_file(masks_dir / candidate):
            return masks_dir / candidate
    return None


def read_mask(path: Path) -> np.ndarray:
    """Mask file -> float32 [H, W] in [0, 1] (color masks use the mean of R, G, B)."""
    values = to_float(read_raw(path))
    if values.ndim == 3:
        values = values[:, :, :3].mean(axis=2) if values.shape[2] >= 3 else values[:, :, 0]
    return values


def binarize(values: np.ndarray) -> np.ndarray:
    """1 where the pixel counts (value > 0.5), else 0."""
    return (values > 0.5).astype(np.float32)
