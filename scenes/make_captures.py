"""Generate small test captures in the formats users bring, with an independent renderer.

The images come from `make_demo.py`'s analytic numpy ray caster (never from our
rasterizer), so a trainer that scores well on them has learned the scene, not its own
renderer. The captures, each a few hundred kB to a few MB:

- `forward`: instant-ngp `transforms.json`, 24 cameras on an arc on ONE side of the
  demo objects (azimuth -50..50 degrees, their aim jittered so the optical axes do not
  meet in one point), `aabb_scale` 4, no point cloud. Trained from it, the old
  random-in-the-cameras'-box initialisation puts every point in a slab around the
  cameras, in front of nothing.
- `forward_points`: the same views plus SfM-like points in `points3d.ply`, named by
  nerfstudio's `ply_file_path` (surface points seen by at least two cameras, with
  position and colour noise).
- `exposure`: the same views with a different exposure (x 2^U(-0.6, 0.6)) and white
  balance (per-channel gains 0.8..1.2) per photo, test views included, with the points.
- `masks`: the forward views with the points, and in every training photo (not the test
  views, every 8th) a passer-by: a sphere of a random colour between the camera and the
  objects, somewhere else in each photo. `masks/frame_NNN.png` (white = keep) masks out
  every pixel the passer-by changed, its shadow included, grown by a pixel; the loader finds
  them beside `images/`. A trainer that ignores the masks grows floaters.
- `synthetic`: NeRF-synthetic layout: the objects alone, centred on the origin, on a
  transparent background (RGBA), 20 training and 5 test cameras on a sphere of radius 4
  looking at the origin, `transforms_train.json` / `transforms_test.json`, no points.
- `fisheye`: a COLMAP text model with one OPENCV_FISHEYE camera (about 150 degrees across
  the diagonal, all four k's non-zero, principal point off centre), 10 views around the
  objects, SfM-like points. Its rays are bent here, in numpy, from the model's definition
  (theta_d = theta (1 + k1 theta^2 + ... + k4 theta^8)), never through OpenCV, so a loader
  that undistorts it must reproduce what a pinhole camera sees.
- `fisheye_json`: the same views as a nerfstudio `transforms.json` with `camera_model:
  OPENCV_FISHEYE`.
- `photos`: a folder of photos and nothing else (no poses, no points), for structure from motion:
  16 views at 192x144 on a ring around the demo objects (one ray per pixel, for speed), whose colours are modulated by a multi-scale noise
  (SIFT needs texture that does not repeat). The true world-to-camera poses go beside the folder,
  in `photos_poses.json`, for tests to compare SfM's cameras with; `orbit_frames` gives a denser
  ring of the same scene for a test video.
- `fisheye_photos`: the `photos` views through an OPENCV_FISHEYE camera of about 137 degrees across
  the diagonal (FISHEYE_PHOTO_PARAMS, rays bent as for `fisheye`), for SfM with a fisheye model;
  `fisheye_photos_poses.json` holds the true poses and the camera's parameters.
- `mixed_photos`: the `photos` ring, every other view at 160x120 (the same field of view), under
  scrambled names: one camera per photo, where COLMAP's first mapping pass leaves photos out.
- `phone`: the speckled objects in 24 photos the shape of a phone's (a 9:16 portrait, 288x512: large
  enough that training starts at a smaller size), on the `photos` ring, as a COLMAP text model
  with SfM-like points.

Run `python scenes/make_captures.py --out DIR [NAME ...]`; deterministic (fixed seeds).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from typing import Dict, List

import cv2
import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("make_demo", os.path.join(_HERE, "make_demo.py"))
demo = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_demo", demo)
_spec.loader.exec_module(demo)

WIDTH, HEIGHT = 96, 72
FOCAL = 86.0  # the demo's field of view (about 58 degrees horizontal)
SUPERSAMPLE = 2
FORWARD_VIEWS = 24
ARC_DEGREES = (-50.0, 50.0)  # azimuths of the arc, around the side facing -y
ARC_RADIUS = 3.7
ARC_ELEVATION_DEG = (12.0, 30.0)
AIM_JITTER = 0.25  # world units: each camera aims near LOOK_AT, not exactly at it
AABB_SCALE = 4  # instant-ngp: a box of 4 / 0.33 units around the origin (default scale/offset)
NUM_POINTS = 2000
SYNTHETIC_SIZE = 80
SYNTHETIC_ANGLE_X = 0.6911112070083618  # the Blender scenes' camera_angle_x
SYNTHETIC_RADIUS = 4.0
SYNTHETIC_TRAIN, SYNTHETIC_TEST = 20, 5
GL_TO_CV = np.diag([1.0, -1.0, -1.0, 1.0])
FISHEYE_WIDTH, FISHEYE_HEIGHT = 96, 72
FISHEYE_PARAMS = (44.0, 44.5, 47.2, 36.6, 0.03, -0.01, 0.004, -0.001)  # fx fy cx cy k1 k2 k3 k4
FISHEYE_VIEWS = 10
FISHEYE_RADIUS = 3.2
PHOTO_WIDTH, PHOTO_HEIGHT, PHOTO_FOCAL = 192, 144, 172.0
PHOTO_VIEWS = 16
# An action camera's moderate fisheye on the photos' 192x144 (fx fy cx cy k1 k2 k3 k4): 137 degrees diagonal.
FISHEYE_PHOTO_PARAMS = (100.0, 100.0, 96.0, 72.0, 0.03, -0.01, 0.004, -0.001)
PHONE_WIDTH, PHONE_HEIGHT, PHONE_FOCAL = 288, 512, 320.0  # 48 x 77 degrees, a phone held upright
PHONE_VIEWS = 24
CAPTURES = ("forward", "forward_points", "exposure", "masks", "synthetic", "fisheye", "fisheye_json", "photos",
            "fisheye_photos", "mixed_photos", "phone")
TEST_EVERY = 8  # the loader's --eval split: every 8th image in name order is a test view
PASSER_BY_RADIUS = 0.3


def intrinsics(width: int, height: int, focal: float) -> np.ndarray:
    return np.array([[focal, 0.0, width / 2.0], [0.0, focal, height / 2.0], [0.0, 0.0, 1.0]])


def render(primitives, w2c: np.ndarray, K: np.ndarray, width: int, height: int, background=None, supersample=None):
    """[H, W, 3] colour and [H, W] coverage, SUPERSAMPLE^2 rays per pixel. With
    `background` None the demo's sky fills misses; otherwise coverage says how much of
    each pixel the objects cover (the alpha of a NeRF-synthetic image)."""
    supersample = supersample or SUPERSAMPLE
    sub = (np.arange(supersample) + 0.5) / supersample
    jj, ii, sj, si = np.meshgrid(np.arange(height), np.arange(width), sub, sub, indexing="ij")
    origins, dirs = demo.pixel_rays(w2c, K, (ii + si).ravel().astype(np.float64), (jj + sj).ravel().astype(np.float64))
    colors = demo.trace(primitives, origins, dirs)
    _, prim_ids = demo.cast(primitives, origins, dirs)
    hit = (prim_ids >= 0).astype(np.float64)
    if background is not None:
        colors[prim_ids < 0] = background
    n = supersample * supersample
    return colors.reshape(height, width, n, 3).mean(axis=2), hit.reshape(height, width, n).mean(axis=2)


def arc_poses(rng: np.random.Generator) -> List[np.ndarray]:
    """World-to-camera poses on an arc in front of the objects (the -y side)."""
    poses = []
    low, high = np.radians(ARC_DEGREES)
    for k in range(FORWARD_VIEWS):
        s = k / (FORWARD_VIEWS - 1)
        azimuth = -math.pi / 2 + low + (high - low) * s
        elevation = math.radians(ARC_ELEVATION_DEG[0] + (ARC_ELEVATION_DEG[1] - ARC_ELEVATION_DEG[0]) * (0.5 + 0.5 * math.sin(5 * s)))
        center = demo.LOOK_AT + ARC_RADIUS * np.array(
            [math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth), math.sin(elevation)])
        target = demo.LOOK_AT + rng.uniform(-AIM_JITTER, AIM_JITTER, 3)
        poses.append(demo.look_at(center, target))
    return poses


def sphere_poses(count: int, rng: np.random.Generator) -> List[np.ndarray]:
    """Cameras at SYNTHETIC_RADIUS from the origin, looking at it, from elevation -20..75 deg."""
    poses = []
    for _ in range(count):
        azimuth = rng.uniform(0, 2 * math.pi)
        elevation = math.asin(rng.uniform(math.sin(math.radians(-20)), math.sin(math.radians(75))))
        center = SYNTHETIC_RADIUS * np.array(
            [math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth), math.sin(elevation)])
        poses.append(demo.look_at(center, np.zeros(3)))
    return poses


def surface_points(primitives, poses, K, width, height, rng) -> tuple:
    """SfM-like points: hits of random pixel rays seen (in frame, unoccluded) by >= 2 cameras."""
    candidates = NUM_POINTS * 3
    views = rng.integers(0, len(poses), size=candidates)
    u, v = rng.uniform(0, width, candidates), rng.uniform(0, height, candidates)
    origins, dirs = np.zeros((candidates, 3)), np.zeros((candidates, 3))
    for view, w2c in enumerate(poses):
        sel = views == view
        origins[sel], dirs[sel] = demo.pixel_rays(w2c, K, u[sel], v[sel])
    t, prim_ids = demo.cast(primitives, origins, dirs)
    hit = prim_ids >= 0
    points, prim_ids = origins[hit] + t[hit, None] * dirs[hit], prim_ids[hit]
    seen = np.zeros(len(points), dtype=int)
    for w2c in poses:
        uv, depth = demo.project(w2c, K, points)
        center = -w2c[:3, :3].T @ w2c[:3, 3]
        to_point = points - center
        dist = np.linalg.norm(to_point, axis=1)
        t_cam, _ = demo.cast(primitives, np.ascontiguousarray(np.broadcast_to(center, points.shape)), to_point / dist[:, None])
        in_frame = (depth > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < width) & (uv[:, 1] >= 0) & (uv[:, 1] < height)
        seen += in_frame & (np.abs(t_cam - dist) < 1e-6 * dist + 1e-6)
    keep = np.flatnonzero(seen >= 2)[:NUM_POINTS]
    colors = demo.surface_color(primitives, points[keep], prim_ids[keep])
    noisy = points[keep] + rng.normal(0.0, 0.004, (len(keep), 3))
    return noisy, np.clip(colors + rng.normal(0.0, 0.02, colors.shape), 0, 1)


def write_ply(path: str, points: np.ndarray, colors: np.ndarray) -> None:
    """A point cloud as nerfstudio writes it (float xyz, uchar rgb)."""
    from plyfile import PlyData, PlyElement

    vertex = np.empty(len(points), dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"),
                                          ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    for i, key in enumerate("xyz"):
        vertex[key] = points[:, i]
    for i, key in enumerate(("red", "green", "blue")):
        vertex[key] = demo.to_uint8(colors[:, i])
    PlyData([PlyElement.describe(vertex, "vertex")], text=False).write(path)


def write_png(path: str, rgb: np.ndarray, alpha=None) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    bgr = demo.to_uint8(rgb)[:, :, ::-1]
    if alpha is not None:
        bgr = np.concatenate([bgr, demo.to_uint8(alpha)[:, :, None]], axis=2)
    cv2.imwrite(path, np.ascontiguousarray(bgr), [cv2.IMWRITE_PNG_COMPRESSION, 9])


def gl_matrix(w2c: np.ndarray) -> list:
    """OpenCV world-to-camera -> the OpenGL camera-to-world matrix transforms.json stores."""
    return (np.linalg.inv(w2c) @ GL_TO_CV).tolist()


def passer_by(w2c: np.ndarray, rng: np.random.Generator):
    """A sphere of a random colour, 1.2 to 2.2 units in front of the camera, off the image centre."""
    center = -w2c[:3, :3].T @ w2c[:3, 3]
    direction = w2c[2, :3] + w2c[0, :3] * rng.uniform(-0.35, 0.35) + w2c[1, :3] * rng.uniform(-0.25, 0.25)
    where = center + rng.uniform(1.2, 2.2) * direction / np.linalg.norm(direction)
    color = tuple(rng.uniform(0.0, 1.0, 3))
    return demo.Sphere(center=tuple(where), radius=PASSER_BY_RADIUS, color_a=color, color_b=color, pattern="checker",
                       frequency=1.0)


def changed_pixels(clean: np.ndarray, disturbed: np.ndarray) -> np.ndarray:
    """[H, W] bool: pixels the disturbance changed, grown by one pixel (its antialiased edge)."""
    changed = (np.abs(clean - disturbed).max(axis=2) > 1e-6).astype(np.uint8)
    return cv2.dilate(changed, np.ones((3, 3), np.uint8)) > 0


def make_forward(out_dir: str, with_points: bool, exposure: bool, passers_by: bool = False) -> None:
    rng = np.random.default_rng(16)
    walkers = np.random.default_rng(20)  # the passers-by: the same whichever other capture is made
    primitives = demo.demo_primitives()
    K = intrinsics(WIDTH, HEIGHT, FOCAL)
    poses = arc_poses(rng)
    look = np.random.default_rng(17)  # the exposures: the same whichever other capture is made
    frames = []
    for index, w2c in enumerate(poses):
        rgb, _ = render(primitives, w2c, K, WIDTH, HEIGHT)
        if passers_by:
            keep = np.ones((HEIGHT, WIDTH), dtype=bool)
            if index % TEST_EVERY:  # a training photo: someone walks through it
                disturbed, _ = render(primitives + [passer_by(w2c, walkers)], w2c, K, WIDTH, HEIGHT)
                keep = ~changed_pixels(rgb, disturbed)
                rgb = disturbed
            write_png(os.path.join(out_dir, f"masks/frame_{index:03d}.png"), np.repeat(keep[:, :, None], 3, axis=2) * 1.0)
        if exposure:
            gain = 2.0 ** look.uniform(-0.6, 0.6) * look.uniform(0.8, 1.2, 3)
            rgb = np.clip(rgb * gain, 0.0, 1.0)
        name = f"images/frame_{index:03d}.png"
        write_png(os.path.join(out_dir, name), rgb)
        frames.append({"file_path": name, "transform_matrix": gl_matrix(w2c)})
    data: Dict[str, object] = {"fl_x": FOCAL, "fl_y": FOCAL, "cx": WIDTH / 2, "cy": HEIGHT / 2, "w": WIDTH, "h": HEIGHT,
                               "aabb_scale": AABB_SCALE, "frames": frames}
    if with_points:
        points, colors = surface_points(primitives, poses, K, WIDTH, HEIGHT, np.random.default_rng(18))
        write_ply(os.path.join(out_dir, "points3d.ply"), points, colors)
        data["ply_file_path"] = "points3d.ply"
    with open(os.path.join(out_dir, "transforms.json"), "w") as f:
        json.dump(data, f, indent=1)


def synthetic_primitives() -> list:
    """The demo's objects without the ground, centred on the origin."""
    shift = -demo.LOOK_AT
    out = []
    for prim in demo.demo_primitives()[1:]:
        center = tuple(np.asarray(prim.center) + shift)
        out.append(type(prim)(**{**prim.__dict__, "center": center}))
    return out


def make_synthetic(out_dir: str) -> None:
    rng = np.random.default_rng(19)
    primitives = synthetic_primitives()
    focal = 0.5 * SYNTHETIC_SIZE / math.tan(0.5 * SYNTHETIC_ANGLE_X)
    K = intrinsics(SYNTHETIC_SIZE, SYNTHETIC_SIZE, focal)
    for split, count in (("train", SYNTHETIC_TRAIN), ("test", SYNTHETIC_TEST)):
        frames = []
        for index, w2c in enumerate(sphere_poses(count, rng)):
            rgb, alpha = render(primitives, w2c, K, SYNTHETIC_SIZE, SYNTHETIC_SIZE, background=np.zeros(3))
            rgb = rgb / np.maximum(alpha, 1e-6)[:, :, None]  # straight (not premultiplied) alpha, as PNG stores
            name = f"{split}/r_{index}"
            write_png(os.path.join(out_dir, name + ".png"), np.clip(rgb, 0, 1), alpha)
            frames.append({"file_path": f"./{name}", "rotation": 0.0, "transform_matrix": gl_matrix(w2c)})
        with open(os.path.join(out_dir, f"transforms_{split}.json"), "w") as f:
            json.dump({"camera_angle_x": SYNTHETIC_ANGLE_X, "frames": frames}, f, indent=1)


def fisheye_rays(w2c: np.ndarray, params, u: np.ndarray, v: np.ndarray):
    """World-space unit rays of an OPENCV_FISHEYE camera through pixel coordinates (u, v):
    the distorted angle theta_d is the normalised radius, and theta solves
    theta (1 + k1 theta^2 + k2 theta^4 + k3 theta^6 + k4 theta^8) = theta_d (Newton)."""
    fx, fy, cx, cy, k1, k2, k3, k4 = params
    xd, yd = (u - cx) / fx, (v - cy) / fy
    theta_d = np.hypot(xd, yd)
    theta = theta_d.copy()
    for _ in range(30):
        t2 = theta * theta
        value = theta * (1 + t2 * (k1 + t2 * (k2 + t2 * (k3 + t2 * k4)))) - theta_d
        slope = 1 + t2 * (3 * k1 + t2 * (5 * k2 + t2 * (7 * k3 + t2 * 9 * k4)))
        theta -= value / slope
    scale = np.where(theta_d > 1e-12, np.sin(theta) / np.maximum(theta_d, 1e-12), 1.0)
    cam_dirs = np.stack([xd * scale, yd * scale, np.cos(theta)], -1)
    rot, trans = w2c[:3, :3], w2c[:3, 3]
    dirs = cam_dirs @ rot
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    return np.ascontiguousarray(np.broadcast_to(-rot.T @ trans, dirs.shape)), dirs


def render_fisheye(primitives, w2c: np.ndarray, params, width: int, height: int) -> np.ndarray:
    sub = (np.arange(SUPERSAMPLE) + 0.5) / SUPERSAMPLE
    jj, ii, sj, si = np.meshgrid(np.arange(height), np.arange(width), sub, sub, indexing="ij")
    origins, dirs = fisheye_rays(w2c, params, (ii + si).ravel().astype(np.float64), (jj + sj).ravel().astype(np.float64))
    return demo.trace(primitives, origins, dirs).reshape(height, width, SUPERSAMPLE * SUPERSAMPLE, 3).mean(axis=2)


def fisheye_poses() -> List[np.ndarray]:
    """A ring around the objects, bobbing in height so that the views are not coplanar."""
    poses = []
    for k in range(FISHEYE_VIEWS):
        azimuth = 2 * math.pi * k / FISHEYE_VIEWS
        elevation = math.radians(20.0 + 12.0 * math.sin(3 * azimuth))
        center = demo.LOOK_AT + FISHEYE_RADIUS * np.array(
            [math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth), math.sin(elevation)])
        poses.append(demo.look_at(center, demo.LOOK_AT))
    return poses


# COLMAP's fisheye models: which of (fx fy cx cy k1 k2 k3 k4) each stores (the rest must be fx or 0).
FISHEYE_MODEL_PARAMS = {"OPENCV_FISHEYE": (0, 1, 2, 3, 4, 5, 6, 7), "RADIAL_FISHEYE": (0, 2, 3, 4, 5),
                        "SIMPLE_RADIAL_FISHEYE": (0, 2, 3, 4)}


def make_fisheye(out_dir: str, as_json: bool, model: str = "OPENCV_FISHEYE", params=FISHEYE_PARAMS) -> None:
    """The `fisheye` captures; `model` and `params` let a test write COLMAP's smaller fisheye models."""
    primitives = demo.demo_primitives()
    poses = fisheye_poses()
    names = [f"images/frame_{k:03d}.png" for k in range(len(poses))]
    for name, w2c in zip(names, poses):
        write_png(os.path.join(out_dir, name), render_fisheye(primitives, w2c, params, FISHEYE_WIDTH, FISHEYE_HEIGHT))
    # points: seen by >= 2 cameras through a pinhole of the same focal length (a narrower view)
    K = intrinsics(FISHEYE_WIDTH, FISHEYE_HEIGHT, params[0])
    points, colors = surface_points(primitives, poses, K, FISHEYE_WIDTH, FISHEYE_HEIGHT, np.random.default_rng(20))
    if as_json:
        fx, fy, cx, cy, k1, k2, k3, k4 = params
        frames = [{"file_path": name, "transform_matrix": gl_matrix(w2c)} for name, w2c in zip(names, poses)]
        write_ply(os.path.join(out_dir, "points3d.ply"), points, colors)
        data = {"camera_model": "OPENCV_FISHEYE", "fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "k1": k1, "k2": k2,
                "k3": k3, "k4": k4, "w": FISHEYE_WIDTH, "h": FISHEYE_HEIGHT, "ply_file_path": "points3d.ply",
                "frames": frames}
        with open(os.path.join(out_dir, "transforms.json"), "w") as f:
            json.dump(data, f, indent=1)
        return
    stored = FISHEYE_MODEL_PARAMS[model]
    if any(params[i] != (params[0] if i == 1 else 0.0) for i in set(range(8)) - set(stored)):
        raise ValueError(f"{model} cannot hold the parameters {params}")
    camera = f"{model} {FISHEYE_WIDTH} {FISHEYE_HEIGHT} " + " ".join(repr(float(params[i])) for i in stored)
    write_colmap_text(out_dir, camera, names, poses, points, colors)


def write_colmap_text(out_dir: str, camera: str, names: List[str], poses: List[np.ndarray], points: np.ndarray,
                      colors: np.ndarray) -> None:
    """A COLMAP text model in out_dir/sparse/0: one camera (`camera`: "MODEL WIDTH HEIGHT PARAMS..."),
    the images `names` (images/...) at their world-to-camera `poses`, and the points."""
    sparse = os.path.join(out_dir, "sparse", "0")
    os.makedirs(sparse, exist_ok=True)
    with open(os.path.join(sparse, "cameras.txt"), "w", newline="\n") as f:
        f.write(f"1 {camera}\n")
    with open(os.path.join(sparse, "images.txt"), "w", newline="\n") as f:
        for index, (name, w2c) in enumerate(zip(names, poses)):
            values = " ".join(repr(float(x)) for x in (*demo.rotation_to_quaternion(w2c[:3, :3]), *w2c[:3, 3]))
            f.write(f"{index + 1} {values} 1 {name[len('images/'):]}\n\n")
    with open(os.path.join(sparse, "points3D.txt"), "w", newline="\n") as f:
        for index, (xyz, rgb) in enumerate(zip(points, demo.to_uint8(colors))):
            f.write(f"{index + 1} {xyz[0]:.6f} {xyz[1]:.6f} {xyz[2]:.6f} {rgb[0]} {rgb[1]} {rgb[2]} 0.5\n")


class Speckled:
    """A primitive whose albedo is modulated by a sum of sines in random 3D directions and scales
    (wavelengths of 0.15 to 1.5 world units): texture that never repeats, which SIFT matches."""

    def __init__(self, base, seed: int):
        rng = np.random.default_rng(seed)
        directions = rng.normal(size=(24, 3))
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        self.base = base
        self.waves = directions * np.geomspace(4.0, 40.0, 24)[:, None]
        self.phases = rng.uniform(0.0, 2 * math.pi, 24)

    def intersect(self, origins: np.ndarray, dirs: np.ndarray) -> np.ndarray:
        return self.base.intersect(origins, dirs)

    def normal(self, points: np.ndarray) -> np.ndarray:
        return self.base.normal(points)

    def albedo(self, points: np.ndarray) -> np.ndarray:
        noise = np.sin(points @ self.waves.T + self.phases).mean(axis=1)  # about N(0, 0.14)
        return np.clip(self.base.albedo(points) * (0.8 + 1.6 * noise)[:, None], 0.0, 1.0)


def speckled_primitives() -> list:
    return [Speckled(prim, seed) for seed, prim in enumerate(demo.demo_primitives(), start=30)]


def orbit_frames(count: int, turns: float = 1.0) -> List[np.ndarray]:
    """World-to-camera poses on a ring around the objects, rising from 22 to 38 degrees."""
    poses = []
    for k in range(count):
        s = k / count
        azimuth = 2 * math.pi * turns * s
        elevation = math.radians(22.0 + 16.0 * s)
        center = demo.LOOK_AT + demo.ORBIT_RADIUS * np.array(
            [math.cos(elevation) * math.cos(azimuth), math.cos(elevation) * math.sin(azimuth), math.sin(elevation)])
        poses.append(demo.look_at(center, demo.LOOK_AT))
    return poses


def render_photo(primitives, w2c: np.ndarray) -> np.ndarray:
    K = intrinsics(PHOTO_WIDTH, PHOTO_HEIGHT, PHOTO_FOCAL)
    return render(primitives, w2c, K, PHOTO_WIDTH, PHOTO_HEIGHT, supersample=1)[0]


def make_photos(out_dir: str, fisheye: bool = False) -> None:
    primitives = speckled_primitives()
    poses = orbit_frames(PHOTO_VIEWS)
    truth = {}
    for k, w2c in enumerate(poses):
        name = f"IMG_{k:04d}.png"
        if fisheye:
            rgb = render_fisheye(primitives, w2c, FISHEYE_PHOTO_PARAMS, PHOTO_WIDTH, PHOTO_HEIGHT)
        else:
            rgb = render_photo(primitives, w2c)
        write_png(os.path.join(out_dir, name), rgb)
        truth[name] = w2c.tolist()
    camera = {"focal": FISHEYE_PHOTO_PARAMS[0], "params": list(FISHEYE_PHOTO_PARAMS)} if fisheye else {"focal": PHOTO_FOCAL}
    truth_path = os.path.join(os.path.dirname(os.path.abspath(out_dir)), f"{os.path.basename(out_dir)}_poses.json")
    with open(truth_path, "w") as f:
        json.dump({**camera, "world_to_cam": truth}, f)


def make_phone(out_dir: str) -> None:
    """The `phone` capture: photos the size and shape of a phone's, scaled down to stay quick (a
    9:16 portrait at 288x512), of the speckled objects (detail at every scale, so that a smaller
    size loses some), 24 views on the `photos` ring, as a COLMAP text model with SfM-like points."""
    primitives = speckled_primitives()
    poses = orbit_frames(PHONE_VIEWS)
    K = intrinsics(PHONE_WIDTH, PHONE_HEIGHT, PHONE_FOCAL)
    names = [f"images/IMG_{k:04d}.png" for k in range(len(poses))]
    for name, w2c in zip(names, poses):
        write_png(os.path.join(out_dir, name), render(primitives, w2c, K, PHONE_WIDTH, PHONE_HEIGHT, supersample=1)[0])
    points, colors = surface_points(primitives, poses, K, PHONE_WIDTH, PHONE_HEIGHT, np.random.default_rng(21))
    camera = f"PINHOLE {PHONE_WIDTH} {PHONE_HEIGHT} {PHONE_FOCAL} {PHONE_FOCAL} {PHONE_WIDTH / 2} {PHONE_HEIGHT / 2}"
    write_colmap_text(out_dir, camera, names, poses, points, colors)


def make_mixed_photos(out_dir: str, views: int = PHOTO_VIEWS, small=(160, 120)) -> None:
    """`views` photos on the `photos` ring; with `small`, every other one at that size (its focal
    length scaled with the width); names scrambled (view k is view_{7k mod views})."""
    os.makedirs(out_dir, exist_ok=True)
    primitives = speckled_primitives()
    for k, w2c in enumerate(orbit_frames(views)):
        width, height = small if small and k % 2 else (PHOTO_WIDTH, PHOTO_HEIGHT)
        K = intrinsics(width, height, PHOTO_FOCAL * width / PHOTO_WIDTH)
        write_png(os.path.join(out_dir, f"view_{(k * 7) % views:03d}.png"),
                  render(primitives, w2c, K, width, height, supersample=1)[0])


def make_capture(name: str, out_dir: str) -> str:
    """Write capture `name` into out_dir/name; returns that folder."""
    folder = os.path.join(out_dir, name)
    os.makedirs(folder, exist_ok=True)
    if name == "synthetic":
        make_synthetic(folder)
    elif name == "mixed_photos":
        make_mixed_photos(folder)
    elif name == "phone":
        make_phone(folder)
    elif name in ("photos", "fisheye_photos"):
        make_photos(folder, fisheye=name == "fisheye_photos")
    elif name in ("fisheye", "fisheye_json"):
        make_fisheye(folder, as_json=name == "fisheye_json")
    elif name in ("forward", "forward_points", "exposure", "masks"):
        make_forward(folder, with_points=name != "forward", exposure=name == "exposure", passers_by=name == "masks")
    else:
        raise ValueError(f"unknown capture {name!r} (choose from {', '.join(CAPTURES)})")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write the captures into")
    parser.add_argument("names", nargs="*", default=list(CAPTURES), help=f"captures to make (default: all of {', '.join(CAPTURES)})")
    args = parser.parse_args()
    for name in args.names:
        start = time.perf_counter()
        print(f"wrote {make_capture(name, args.out)} in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
