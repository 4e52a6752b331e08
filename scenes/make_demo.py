"""Generate the embedded demo scene: a small synthetic capture in COLMAP text format.

Why synthetic, and why ray casting: the demo must have exact ground truth that owes
nothing to Gaussian splatting, so that training on it measures the trainer and not a
renderer agreeing with itself. The images come from analytic ray casting in numpy of a
few textured primitives (three spheres, a turned box, a ground disc) under one
directional light with Lambertian shading and hard shadows. The sparse points imitate
structure-from-motion: surface points seen by at least two cameras, with their shaded
colour, small position and colour noise, and COLMAP-style tracks.

Conventions are COLMAP's: world-to-camera quaternion (qw, qx, qy, qz) and translation,
camera x right, y down, z forward, pixel centres at (i + 0.5, j + 0.5). The world is
z-up, and the ground is the plane z = 0.

Run `python scenes/make_demo.py --out scenes/demo`; the output is deterministic (fixed
seed), so re-running it reproduces the committed folder byte for byte.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import time
from dataclasses import dataclass
from typing import List, Tuple

import cv2
import numpy as np

# ---------------------------------------------------------------------------
# Capture settings
# ---------------------------------------------------------------------------

SEED = 2024
WIDTH, HEIGHT = 128, 96
FOCAL = 115.0  # pixels; about 58 degrees horizontal field of view
NUM_VIEWS = 32
SUPERSAMPLE = 3  # rays per pixel side, averaged: anti-aliased edges like a real lens
ORBIT_RADIUS = 3.7
LOOK_AT = np.array([0.0, 0.0, 0.45])
ELEVATION_RANGE_DEG = (18.0, 52.0)  # the orbit climbs from low to high over two turns
ORBIT_TURNS = 2.0

NUM_POINTS = 3000
MAX_TRACK_LENGTH = 6  # SfM matches a point in a few views, not all; keeps files small
POINT_POSITION_NOISE = 0.004  # world units
POINT_COLOR_NOISE = 0.02  # in [0, 1] colour units
KEYPOINT_NOISE_PX = 0.25

LIGHT_DIR = np.array([0.45, -0.35, 0.82]) / np.linalg.norm([0.45, -0.35, 0.82])
AMBIENT = 0.3  # share of light that reaches surfaces facing away or in shadow
SKY_HORIZON = np.array([0.85, 0.90, 0.96])
SKY_ZENITH = np.array([0.45, 0.62, 0.88])

_EPS = 1e-4  # offset along the normal before casting a secondary ray
_NO_HIT = np.inf

# ---------------------------------------------------------------------------
# Primitives: each one can intersect rays, give normals and give its albedo
# ---------------------------------------------------------------------------


def _checker(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """1 where the integer cells (floor(u), floor(v)) have odd parity, else 0."""
    return ((np.floor(u) + np.floor(v)) % 2).astype(np.float64)


def _mix(a, b, weight: np.ndarray) -> np.ndarray:
    """Per-point blend of two colours: a where weight is 0, b where it is 1."""
    w = weight[:, None]
    return (1.0 - w) * np.asarray(a, dtype=np.float64) + w * np.asarray(b, dtype=np.float64)


@dataclass(frozen=True)
class Sphere:
    """A sphere with a procedural texture in its own spherical coordinates.

    pattern "checker": a longitude/latitude checkerboard of `frequency` cells around.
    pattern "stripes": bands across the tilted `axis`, `frequency` bands per radius.
    """

    center: Tuple[float, float, float]
    radius: float
    color_a: Tuple[float, float, float]
    color_b: Tuple[float, float, float]
    pattern: str
    frequency: float
    axis: Tuple[float, float, float] = (0.0, 0.0, 1.0)

    def intersect(self, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
        """Nearest positive distance along each unit ray, or inf on a miss."""
        oc = origins - np.asarray(self.center)
        b = np.einsum("ij,ij->i", oc, dirs)
        c = np.einsum("ij,ij->i", oc, oc) - self.radius**2
        disc = b * b - c
        root = np.sqrt(np.maximum(disc, 0.0))
        near, far = -b - root, -b + root
        t = np.where(near > 0.0, near, far)  # from inside, the far root is the exit
        return np.where((disc >= 0.0) & (t > 0.0), t, _NO_HIT)

    def normal(self, points: np.ndarray) -> np.ndarray:
        return (points - np.asarray(self.center)) / self.radius

    def albedo(self, points: np.ndarray) -> np.ndarray:
        local = np.clip(self.normal(points), -1.0, 1.0)
        if self.pattern == "checker":
            lon = np.arctan2(local[:, 1], local[:, 0]) / (2.0 * math.pi)  # [-0.5, 0.5]
            lat = np.arcsin(local[:, 2]) / math.pi  # [-0.5, 0.5]
            cells = _checker(lon * self.frequency, lat * self.frequency / 2.0)
        elif self.pattern == "stripes":
            axis = np.asarray(self.axis) / np.linalg.norm(self.axis)
            cells = (np.floor(local @ axis * self.frequency) % 2).astype(np.float64)
        else:
            raise ValueError(f"unknown sphere pattern {self.pattern!r}")
        return _mix(self.color_a, self.color_b, cells)


@dataclass(frozen=True)
class Box:
    """A box standing on the ground, turned by `yaw` about the world z axis.

    Texture: a base colour with a darker grid of `grid` cells per unit length, so every
    face carries edges that pin down its position.
    """

    center: Tuple[float, float, float]
    half_size: Tuple[float, float, float]
    yaw: float
    color: Tuple[float, float, float]
    line_color: Tuple[float, float, float]
    grid: float

    def _to_box_frame(self, vectors: np.ndarray) -> np.ndarray:
        """Rotate world vectors by -yaw about z (elementwise: much faster than a matmul
        with a 3x3 for millions of rays)."""
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        x, y = vectors[:, 0], vectors[:, 1]
        return np.stack([c * x + s * y, c * y - s * x, vectors[:, 2]], axis=1)

    def _to_world_frame(self, vectors: np.ndarray) -> np.ndarray:
        c, s = math.cos(self.yaw), math.sin(self.yaw)
        x, y = vectors[:, 0], vectors[:, 1]
        return np.stack([c * x - s * y, s * x + c * y, vectors[:, 2]], axis=1)

    def intersect(self, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
        """Slab method in the box frame: the ray is inside the box between the last
        slab entry and the first slab exit."""
        o = self._to_box_frame(origins - np.asarray(self.center))
        d = self._to_box_frame(dirs)
        t_enter = np.full(len(o), -np.inf)
        t_exit = np.full(len(o), np.inf)
        for axis, half in enumerate(self.half_size):
            with np.errstate(divide="ignore", invalid="ignore"):
                t1 = (-half - o[:, axis]) / d[:, axis]
                t2 = (half - o[:, axis]) / d[:, axis]
            t1 = np.nan_to_num(t1, nan=-np.inf)  # ray parallel to a slab and on its border
            t2 = np.nan_to_num(t2, nan=np.inf)
            t_enter = np.maximum(t_enter, np.minimum(t1, t2))
            t_exit = np.minimum(t_exit, np.maximum(t1, t2))
        t = np.where(t_enter > 0.0, t_enter, t_exit)
        return np.where((t_enter <= t_exit) & (t > 0.0), t, _NO_HIT)

    def normal(self, points: np.ndarray) -> np.ndarray:
        """The face normal is the axis along which the point is closest to a face."""
        local = self._to_box_frame(points - np.asarray(self.center))
        scaled = local / np.asarray(self.half_size)
        face_axis = np.argmax(np.abs(scaled), axis=1)
        n_local = np.zeros_like(local)
        rows = np.arange(len(local))
        n_local[rows, face_axis] = np.sign(scaled[rows, face_axis])
        return self._to_world_frame(n_local)

    def albedo(self, points: np.ndarray) -> np.ndarray:
        local = self._to_box_frame(points - np.asarray(self.center)) + np.asarray(self.half_size)
        cells = local * self.grid
        # distance to the nearest grid line, per axis; the face's own normal axis is
        # constant over the face, so take the two in-face axes by dropping the largest
        face_axis = np.argmax(np.abs(local / (2 * np.asarray(self.half_size)) - 0.5), axis=1)
        to_line = np.abs(cells - np.round(cells))
        to_line[np.arange(len(local)), face_axis] = 1.0
        on_line = (to_line.min(axis=1) < 0.08).astype(np.float64)
        return _mix(self.color, self.line_color, on_line)


@dataclass(frozen=True)
class GroundDisc:
    """The plane z = 0 inside `radius`: tiles near the objects that fade to plain far
    away (so the distant ground does not alias into noise)."""

    radius: float
    tile: float
    color_a: Tuple[float, float, float]
    color_b: Tuple[float, float, float]
    fade_start: float

    def intersect(self, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            t = -origins[:, 2] / dirs[:, 2]
        hit = origins[:, :2] + np.nan_to_num(t)[:, None] * dirs[:, :2]
        inside = np.einsum("ij,ij->i", hit, hit) <= self.radius**2
        return np.where(np.isfinite(t) & (t > 0.0) & inside, t, _NO_HIT)

    def normal(self, points: np.ndarray) -> np.ndarray:
        n = np.zeros_like(points)
        n[:, 2] = 1.0
        return n

    def albedo(self, points: np.ndarray) -> np.ndarray:
        tiles = _checker(points[:, 0] / self.tile, points[:, 1] / self.tile)
        dist = np.linalg.norm(points[:, :2], axis=1)
        fade = np.clip((dist - self.fade_start) / (self.radius - self.fade_start), 0.0, 1.0)
        contrast = (1.0 - fade) * tiles + fade * 0.5  # far away: the mean of both colours
        return _mix(self.color_a, self.color_b, contrast)


def demo_primitives() -> List:
    """The demo scene's objects, clustered around LOOK_AT."""
    return [
        GroundDisc(radius=6.0, tile=0.5, color_a=(0.55, 0.55, 0.5), color_b=(0.8, 0.78, 0.72),
                   fade_start=2.5),
        Sphere(center=(-0.75, -0.2, 0.6), radius=0.6, color_a=(0.85, 0.15, 0.12),
               color_b=(0.95, 0.92, 0.85), pattern="checker", frequency=10),
        Sphere(center=(0.75, -0.45, 0.42), radius=0.42, color_a=(0.12, 0.25, 0.8),
               color_b=(0.95, 0.8, 0.15), pattern="stripes", frequency=4.5,
               axis=(0.3, 0.5, 0.8)),
        Sphere(center=(0.05, 0.95, 0.3), radius=0.3, color_a=(0.1, 0.6, 0.25),
               color_b=(0.85, 0.95, 0.8), pattern="stripes", frequency=3.0,
               axis=(1.0, 0.0, 0.2)),
        Box(center=(0.55, 0.55, 0.4), half_size=(0.32, 0.25, 0.4), yaw=0.5,
            color=(0.95, 0.55, 0.15), line_color=(0.35, 0.15, 0.05), grid=5.0),
    ]


# ---------------------------------------------------------------------------
# Ray casting and shading
# ---------------------------------------------------------------------------


def cast(primitives, origins: np.ndarray, dirs: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Nearest hit over all primitives: (distance or inf, primitive index or -1)."""
    distances = np.stack([p.intersect(origins, dirs) for p in primitives])  # [P, N]
    nearest = np.argmin(distances, axis=0)
    t = distances[nearest, np.arange(len(origins))]
    return t, np.where(np.isfinite(t), nearest, -1)


def surface_color(primitives, points: np.ndarray, prim_ids: np.ndarray) -> np.ndarray:
    """Lambertian radiance of surface points: albedo * (ambient + direct, if unshadowed).

    It depends on the point only, not on the viewer, which is what lets an SfM point
    carry one colour for every view it is seen in.
    """
    albedo = np.zeros_like(points)
    normals = np.zeros_like(points)
    for index, prim in enumerate(primitives):
        sel = prim_ids == index
        if np.any(sel):
            albedo[sel] = prim.albedo(points[sel])
            normals[sel] = prim.normal(points[sel])
    facing = np.clip(normals @ LIGHT_DIR, 0.0, 1.0)
    to_light = np.broadcast_to(LIGHT_DIR, points.shape)
    shadow_t, _ = cast(primitives, points + _EPS * normals, np.ascontiguousarray(to_light))
    lit = np.isinf(shadow_t).astype(np.float64)
    return albedo * (AMBIENT + (1.0 - AMBIENT) * facing * lit)[:, None]


def sky_color(dirs: np.ndarray) -> np.ndarray:
    """Background: a plain gradient from a pale horizon to a bluer zenith."""
    up = np.clip(dirs[:, 2], 0.0, 1.0) ** 0.5
    return _mix(SKY_HORIZON, SKY_ZENITH, up)


def trace(primitives, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
    """Colour seen along each unit ray."""
    t, prim_ids = cast(primitives, origins, dirs)
    colors = sky_color(dirs)
    hit = prim_ids >= 0
    points = origins[hit] + t[hit, None] * dirs[hit]
    colors[hit] = surface_color(primitives, points, prim_ids[hit])
    return colors


# ---------------------------------------------------------------------------
# Cameras
# ---------------------------------------------------------------------------


def intrinsics() -> np.ndarray:
    """Pinhole K with the principal point at the image centre."""
    return np.array([[FOCAL, 0.0, WIDTH / 2.0], [0.0, FOCAL, HEIGHT / 2.0], [0.0, 0.0, 1.0]])


def look_at(center: np.ndarray, target: np.ndarray) -> np.ndarray:
    """World-to-camera [4, 4] for a camera at `center` looking at `target`, z-up world,
    OpenCV axes (x right, y down, z forward)."""
    forward = (target - center) / np.linalg.norm(target - center)
    right = np.cross(forward, [0.0, 0.0, 1.0])
    right /= np.linalg.norm(right)
    down = np.cross(forward, right)
    rot = np.stack([right, down, forward])  # rows: camera axes in world coordinates
    w2c = np.eye(4)
    w2c[:3, :3] = rot
    w2c[:3, 3] = -rot @ center
    return w2c


def orbit_poses() -> List[np.ndarray]:
    """NUM_VIEWS cameras on a rising spiral around LOOK_AT, in capture order."""
    poses = []
    low, high = np.radians(ELEVATION_RANGE_DEG)
    for k in range(NUM_VIEWS):
        s = k / (NUM_VIEWS - 1)
        azimuth = 2.0 * math.pi * ORBIT_TURNS * k / NUM_VIEWS
        elevation = low + (high - low) * s
        offset = ORBIT_RADIUS * np.array([math.cos(elevation) * math.cos(azimuth),
                                          math.cos(elevation) * math.sin(azimuth),
                                          math.sin(elevation)])
        poses.append(look_at(LOOK_AT + offset, LOOK_AT))
    return poses


def pixel_rays(w2c: np.ndarray, K: np.ndarray, u: np.ndarray, v: np.ndarray):
    """World-space unit rays through continuous pixel coordinates (u, v)."""
    rot, trans = w2c[:3, :3], w2c[:3, 3]
    cam_dirs = np.stack([(u - K[0, 2]) / K[0, 0], (v - K[1, 2]) / K[1, 1], np.ones_like(u)], -1)
    dirs = cam_dirs @ rot  # rot.T applied to each row: camera to world
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    origins = np.broadcast_to(-rot.T @ trans, dirs.shape)
    return np.ascontiguousarray(origins), dirs


def render(primitives, w2c: np.ndarray, K: np.ndarray) -> np.ndarray:
    """[H, W, 3] float image in [0, 1], SUPERSAMPLE^2 rays per pixel on a regular grid."""
    sub = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    jj, ii, sj, si = np.meshgrid(np.arange(HEIGHT), np.arange(WIDTH), sub, sub, indexing="ij")
    origins, dirs = pixel_rays(w2c, K, (ii + si).ravel().astype(np.float64),
                               (jj + sj).ravel().astype(np.float64))
    colors = trace(primitives, origins, dirs)
    return colors.reshape(HEIGHT, WIDTH, SUPERSAMPLE * SUPERSAMPLE, 3).mean(axis=2)


def project(w2c: np.ndarray, K: np.ndarray, points: np.ndarray):
    """Pixel coordinates [N, 2] and camera depth [N] of world points."""
    cam = points @ w2c[:3, :3].T + w2c[:3, 3]
    uv = cam[:, :2] / cam[:, 2:3] * K[[0, 1], [0, 1]] + K[[0, 1], [2, 2]]
    return uv, cam[:, 2]


# ---------------------------------------------------------------------------
# Simulated structure from motion
# ---------------------------------------------------------------------------


def visible_in(primitives, w2c, K, points, normals) -> Tuple[np.ndarray, np.ndarray]:
    """Which points a camera sees (in frame, unoccluded, not at a grazing angle), and
    where they land. Grazing and edge points are the ones SfM would not match either."""
    uv, depth = project(w2c, K, points)
    margin = 1.0
    in_frame = ((depth > 0) & (uv[:, 0] >= margin) & (uv[:, 0] < WIDTH - margin)
                & (uv[:, 1] >= margin) & (uv[:, 1] < HEIGHT - margin))
    center = -w2c[:3, :3].T @ w2c[:3, 3]
    to_point = points - center
    dist = np.linalg.norm(to_point, axis=1)
    dirs = to_point / dist[:, None]
    t, _ = cast(primitives, np.ascontiguousarray(np.broadcast_to(center, points.shape)), dirs)
    unoccluded = np.abs(t - dist) < 1e-6 * dist + 1e-6
    facing = -np.einsum("ij,ij->i", dirs, normals) > 0.25
    return in_frame & unoccluded & facing, uv


def sample_points(primitives, poses, K, rng):
    """SfM-like points: hits of random pixel rays that at least two cameras see.

    Returns true positions [N, 3], primitive ids [N], and per-point tracks as lists of
    (view index, true pixel position).
    """
    candidates = int(NUM_POINTS * 1.6)
    views = rng.integers(0, len(poses), size=candidates)
    u = rng.uniform(0, WIDTH, size=candidates)
    v = rng.uniform(0, HEIGHT, size=candidates)
    origins = np.zeros((candidates, 3))
    dirs = np.zeros((candidates, 3))
    for view in range(len(poses)):
        sel = views == view
        origins[sel], dirs[sel] = pixel_rays(poses[view], K, u[sel], v[sel])
    t, prim_ids = cast(primitives, origins, dirs)
    hit = prim_ids >= 0
    points, prim_ids = origins[hit] + t[hit, None] * dirs[hit], prim_ids[hit]

    normals = np.zeros_like(points)
    for index, prim in enumerate(primitives):
        sel = prim_ids == index
        normals[sel] = prim.normal(points[sel])
    seen = []
    where = []
    for w2c in poses:
        visible, uv = visible_in(primitives, w2c, K, points, normals)
        seen.append(visible)
        where.append(uv)
    seen = np.stack(seen, axis=1)  # [N, V]
    keep = np.flatnonzero(seen.sum(axis=1) >= 2)[:NUM_POINTS]

    tracks = []
    for p in keep:
        views_seen = np.flatnonzero(seen[p])
        if len(views_seen) > MAX_TRACK_LENGTH:
            views_seen = np.sort(rng.choice(views_seen, MAX_TRACK_LENGTH, replace=False))
        tracks.append([(int(view), where[view][p]) for view in views_seen])
    return points[keep], prim_ids[keep], tracks


# ---------------------------------------------------------------------------
# COLMAP text writer
# ---------------------------------------------------------------------------


def rotation_to_quaternion(rot: np.ndarray) -> np.ndarray:
    """(qw, qx, qy, qz) of a rotation matrix, with qw >= 0 (Shepperd's method)."""
    trace_ = np.trace(rot)
    if trace_ > 0:
        s = 2.0 * math.sqrt(1.0 + trace_)
        q = [0.25 * s, (rot[2, 1] - rot[1, 2]) / s, (rot[0, 2] - rot[2, 0]) / s,
             (rot[1, 0] - rot[0, 1]) / s]
    else:
        i = int(np.argmax(np.diag(rot)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(1.0 + rot[i, i] - rot[j, j] - rot[k, k])
        q = [0.0] * 4
        q[0] = (rot[k, j] - rot[j, k]) / s
        q[1 + i] = 0.25 * s
        q[1 + j] = (rot[j, i] + rot[i, j]) / s
        q[1 + k] = (rot[k, i] + rot[i, k]) / s
    q = np.array(q)
    q /= np.linalg.norm(q)
    return q if q[0] >= 0 else -q


def write_colmap_text(sparse_dir: str, K, poses, names, points, colors, errors, observations):
    """cameras.txt, images.txt and points3D.txt as COLMAP's text exporter lays them out.

    observations[i] is the list of (point id, pixel) seen in image i; the POINT2D_IDX
    of a track entry is the position of that observation in its image's list.
    """
    os.makedirs(sparse_dir, exist_ok=True)
    with open(os.path.join(sparse_dir, "cameras.txt"), "w", newline="\n") as f:
        f.write("# Camera list with one line of data per camera:\n")
        f.write("#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n")
        f.write("# Number of cameras: 1\n")
        params = " ".join(repr(float(x)) for x in (K[0, 0], K[1, 1], K[0, 2], K[1, 2]))
        f.write(f"1 PINHOLE {WIDTH} {HEIGHT} {params}\n")

    tracks = {}  # point id -> [(image id, point2d index)]
    mean_obs = sum(len(o) for o in observations) / len(observations)
    with open(os.path.join(sparse_dir, "images.txt"), "w", newline="\n") as f:
        f.write("# Image list with two lines of data per image:\n")
        f.write("#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n")
        f.write("#   POINTS2D[] as (X, Y, POINT3D_ID)\n")
        f.write(f"# Number of images: {len(poses)}, mean observations per image: {mean_obs:g}\n")
        for index, (w2c, name) in enumerate(zip(poses, names)):
            image_id = index + 1
            q = rotation_to_quaternion(w2c[:3, :3])
            values = " ".join(repr(float(x)) for x in (*q, *w2c[:3, 3]))
            f.write(f"{image_id} {values} 1 {name}\n")
            entries = []
            for point2d_idx, (point_id, uv) in enumerate(observations[index]):
                entries.append(f"{uv[0]:.4f} {uv[1]:.4f} {point_id}")
                tracks.setdefault(point_id, []).append((image_id, point2d_idx))
            f.write(" ".join(entries) + "\n")

    mean_track = sum(len(t) for t in tracks.values()) / max(len(tracks), 1)
    with open(os.path.join(sparse_dir, "points3D.txt"), "w", newline="\n") as f:
        f.write("# 3D point list with one line of data per point:\n")
        f.write("#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)\n")
        f.write(f"# Number of points: {len(points)}, mean track length: {mean_track:g}\n")
        for index, (xyz, rgb, err) in enumerate(zip(points, colors, errors)):
            point_id = index + 1
            track = " ".join(f"{i} {j}" for i, j in tracks[point_id])
            f.write(f"{point_id} {xyz[0]:.6f} {xyz[1]:.6f} {xyz[2]:.6f} "
                    f"{rgb[0]} {rgb[1]} {rgb[2]} {err:.6f} {track}\n")


# ---------------------------------------------------------------------------
# The whole capture
# ---------------------------------------------------------------------------


def image_name(index: int) -> str:
    return f"frame_{index:03d}.png"


def to_uint8(image: np.ndarray) -> np.ndarray:
    return np.clip(np.round(image * 255.0), 0, 255).astype(np.uint8)


def make_demo(out_dir: str) -> None:
    """Render the views and write the capture under out_dir (images/, sparse/0/)."""
    rng = np.random.default_rng(SEED)
    primitives = demo_primitives()
    K = intrinsics()
    poses = orbit_poses()
    names = [image_name(i) for i in range(NUM_VIEWS)]

    image_dir = os.path.join(out_dir, "images")
    os.makedirs(image_dir, exist_ok=True)
    for old in os.listdir(image_dir):  # frames of an earlier, longer capture would linger
        if re.fullmatch(r"frame_\d{3}\.png", old):
            os.remove(os.path.join(image_dir, old))
    for w2c, name in zip(poses, names):
        rgb = to_uint8(render(primitives, w2c, K))
        # fixed compression settings: the same bytes on every run
        cv2.imwrite(os.path.join(image_dir, name), np.ascontiguousarray(rgb[:, :, ::-1]),
                    [cv2.IMWRITE_PNG_COMPRESSION, 9])

    true_points, prim_ids, tracks = sample_points(primitives, poses, K, rng)
    true_colors = surface_color(primitives, true_points, prim_ids)
    noisy_colors = true_colors + rng.normal(0.0, POINT_COLOR_NOISE, true_colors.shape)
    noisy_points = true_points + rng.normal(0.0, POINT_POSITION_NOISE, true_points.shape)

    observations = [[] for _ in poses]
    errors = []
    for index, track in enumerate(tracks):
        residuals = []
        for view, uv in track:
            keypoint = uv + rng.normal(0.0, KEYPOINT_NOISE_PX, 2)
            observations[view].append((index + 1, keypoint))
            reprojected, _ = project(poses[view], K, noisy_points[index:index + 1])
            residuals.append(np.linalg.norm(reprojected[0] - keypoint))
        errors.append(float(np.mean(residuals)))

    write_colmap_text(os.path.join(out_dir, "sparse", "0"), K, poses, names, noisy_points,
                      to_uint8(noisy_colors), errors, observations)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo")
    parser.add_argument("--out", default=default_out, help="output folder (default: %(default)s)")
    args = parser.parse_args()
    start = time.perf_counter()
    make_demo(args.out)
    print(f"wrote {args.out} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
