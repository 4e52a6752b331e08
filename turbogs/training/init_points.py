"""Where the Gaussians start: the capture's points, or points along the camera rays.

A capture with structure-from-motion points (COLMAP's points3D, nerfstudio's
`ply_file_path`) starts from them. Without points, the Gaussians must still start where
the subject is, and the cameras say where that is:

1. **Focus point.** Every camera looks along its optical axis. The point nearest all
   axes in the least-squares sense is where the photographer pointed the cameras: the
   centre of an object-centric orbit, or the subject in front of an arc of cameras.
2. **Depth bounds.** A photographer frames the subject: at the focus distance z, the
   half-width the camera sees, r = z * tan(fov / 2), is about the subject's radius. Points
   go between depths z - r and z + r of each camera (never nearer than NEAR_FRACTION * z).
   For the NeRF-synthetic cameras (z = 4, 40 degree field of view) that is +-1.45, close
   to INRIA's +-1.3 cube.
3. **Points on rays.** A point is a random pixel of a random training view (inside its
   mask), at a random depth in those bounds, with that pixel's colour. Candidates seen by
   fewer than two cameras are dropped (the rest of the capture cannot constrain them).
4. **The capture's box.** instant-ngp's `aabb_scale` / `scale` / `offset` declare the box
   the scene lives in; depths are clipped to it.

When the axes do not converge (all parallel, one camera, cameras looking outward), there
is no focus point: the depths then come from the declared box if there is one, else
from the cameras' spread (2x to 50x it, uniform in inverse depth, as forward-facing
captures are modelled), and the log says so.

**The far background.** The capture's points are joined by background points (`background_points`
of TrainConfig, a share of them): random training pixels, with their colour, at 2x to 20x their
camera's focus distance. Structure from motion triangulates nothing in the sky and little in a far,
blurred background, so without them the background is grown from the subject's Gaussians and
settles at the cameras' own distance: seen from the far side of an orbit such a blob lies on the
sky, which it matches, and a camera beside it sees it as fog (the demo's lowest test view lost up
to 10 dB so). A point at camera depth d >= 2f along any ray lies at least f from the focus point
(|P - F|^2 = f^2 + d^2/cos^2(t) - 2fd >= f^2 at d = 2f), so none starts inside an orbit's sphere of
cameras; uniform in inverse depth, half of them lie within 3.6f (a room's walls), the rest out to
20f (the sky, at little parallax). The start along rays gets none: its random pixels already
include the background's, and on the real capture without points (the fox) background points lost
in turbo's 100 s where a synthetic one gained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch

from turbogs.data.scene import Camera, Scene
from turbogs.geometry import nearest_point_to_lines

NEAR_FRACTION = 0.2  # nearest depth, as a share of the focus distance
OVERSAMPLE = 2  # candidates per kept point, before the visibility filter
FALLBACK_DEPTHS = (2.0, 50.0)  # without a focus point or box: depths in units of the cameras' spread
BACKGROUND_DEPTHS = (2.0, 20.0)  # background points: camera depths in units of the focus distance


@dataclass
class Focus:
    """Where the optical axes converge, or why they do not."""

    point: Optional[np.ndarray]  # [3] or None
    distances: Optional[np.ndarray] = None  # [N] each camera's depth of the point
    reason: str = ""  # why there is no focus point


def camera_centers_and_axes(cameras: List[Camera]) -> Tuple[np.ndarray, np.ndarray]:
    """World centres [N, 3] and unit viewing directions [N, 3] (camera +z in world)."""
    w2c = np.stack([c.world_to_cam.double().numpy() for c in cameras])
    R, t = w2c[:, :3, :3], w2c[:, :3, 3]
    centers = -np.einsum("nji,nj->ni", R, t)
    return centers, R[:, 2, :]


def focus_point(centers: np.ndarray, axes: np.ndarray) -> Focus:
    """Where the optical axes converge (the point nearest them all), or why they do not."""
    if len(centers) < 2:
        return Focus(None, reason="the capture has a single training camera")
    point = nearest_point_to_lines(centers, axes)
    if point is None:
        return Focus(None, reason="the cameras' optical axes are (nearly) parallel, so they meet nowhere")
    distances = np.einsum("ni,ni->n", point[None] - centers, axes)
    if np.median(distances) <= 0:
        return Focus(None, reason="the cameras' optical axes meet behind the cameras (they look outward)")
    return Focus(point, distances)


def ray_box(origins: torch.Tensor, dirs: torch.Tensor, box: np.ndarray) -> Tuple[torch.Tensor, torch.Tensor]:
    """Slab test: the ray parameters where each ray enters and leaves the box (enter > exit: a miss)."""
    lo, hi = (torch.as_tensor(b, dtype=dirs.dtype) for b in box)
    safe = torch.where(dirs.abs() < 1e-12, torch.full_like(dirs, 1e-12), dirs)
    t1, t2 = (lo - origins) / safe, (hi - origins) / safe
    enter = torch.minimum(t1, t2).max(dim=1).values.clamp_min(0)
    leave = torch.maximum(t1, t2).min(dim=1).values
    return enter, leave


def count_views(points: torch.Tensor, cameras: List[Camera]) -> torch.Tensor:
    """How many cameras have each point in front of them and inside their image."""
    seen = torch.zeros(len(points), dtype=torch.int64)
    for camera in cameras:
        cam = points @ camera.world_to_cam[:3, :3].double().T + camera.world_to_cam[:3, 3].double()
        z = cam[:, 2]
        uv = cam[:, :2] / z.clamp_min(1e-9)[:, None] * camera.K[[0, 1], [0, 1]].double() + camera.K[[0, 1], [2, 2]].double()
        seen += ((z > 0) & (uv[:, 0] >= 0) & (uv[:, 0] < camera.width) & (uv[:, 1] >= 0) & (uv[:, 1] < camera.height)).long()
    return seen


class RaySampler:
    """Random pixels of random training views (inside their masks), as world rays
    parametrised by camera depth, with the pixel's colour."""

    def __init__(self, cameras: List[Camera], generator: torch.Generator):
        self.cameras, self.generator = cameras, generator

    def sample(self, count: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(camera index [M], origin [M, 3], direction with unit camera-z [M, 3], colour [M, 3])."""
        views = torch.randint(len(self.cameras), (count,), generator=self.generator)
        origins, dirs, colors = (torch.zeros(count, 3, dtype=torch.float64) for _ in range(3))
        for index, camera in enumerate(self.cameras):
            rows = torch.nonzero(views == index).flatten()
            if len(rows) == 0:
                continue
            valid = (torch.ones(camera.height, camera.width) if camera.mask is None else camera.mask) > 0.5
            pixels = torch.nonzero(valid.flatten()).flatten()
            if len(pixels) == 0:  # a view masked out entirely: any pixel of it
                pixels = torch.arange(camera.height * camera.width)
            chosen = pixels[torch.randint(len(pixels), (len(rows),), generator=self.generator)]
            v, u = chosen // camera.width, chosen % camera.width
            K = camera.K.double()
            jitter = torch.rand(len(rows), 2, generator=self.generator, dtype=torch.float64)
            cam_dirs = torch.stack([(u + jitter[:, 0] - K[0, 2]) / K[0, 0], (v + jitter[:, 1] - K[1, 2]) / K[1, 1],
                                    torch.ones(len(rows), dtype=torch.float64)], dim=1)
            R, t = camera.world_to_cam[:3, :3].double(), camera.world_to_cam[:3, 3].double()
            origins[rows] = -R.T @ t
            dirs[rows] = cam_dirs @ R  # R^T applied to each row: camera to world, camera-z stays 1
            colors[rows] = camera.image[v, u].double() if camera.image is not None else 0.5
        return views, origins, dirs, colors


def depth_bounds(cameras: List[Camera], focus: Focus, views: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, str]:
    """Per-sample [near, far] camera depths around the focus point, and their description."""
    half_tan = np.array([math.tan(0.5 * max(c.fov_x, c.fov_y)) for c in cameras])
    z = np.maximum(focus.distances, 1e-6)
    radius = float(np.median(z * half_tan))
    near = np.maximum(z - radius, NEAR_FRACTION * z)
    far = z + radius
    what = (f"the optical axes converge at ({', '.join(f'{x:.2f}' for x in focus.point)}), "
            f"{float(np.median(z)):.2f} in front of the cameras; the view there is {radius:.2f} in radius, "
            f"so depths {float(np.median(near)):.2f}-{float(np.median(far)):.2f}")
    return torch.from_numpy(near)[views], torch.from_numpy(far)[views], what


def fallback_bounds(centers: np.ndarray, count: int) -> Tuple[torch.Tensor, torch.Tensor, float, str]:
    """Depths from the cameras' spread alone (no focus point, no box)."""
    spread = float(np.linalg.norm(centers - centers.mean(axis=0), axis=1).max()) * 2 if len(centers) > 1 else 0.0
    unit = spread if spread > 1e-9 else 1.0
    near, far = FALLBACK_DEPTHS[0] * unit, FALLBACK_DEPTHS[1] * unit
    what = (f"depths {near:.3g}-{far:.3g} ({FALLBACK_DEPTHS[0]:g}x to {FALLBACK_DEPTHS[1]:g}x "
            + (f"the cameras' spread {spread:.3g}" if spread > 1e-9 else "the capture's unit length, the cameras having no spread")
            + ", uniform in inverse depth)")
    return torch.full((count,), near, dtype=torch.float64), torch.full((count,), far, dtype=torch.float64), unit, what


def points_along_rays(scene: Scene, count: int, generator: torch.Generator) -> Tuple[np.ndarray, np.ndarray, str]:
    """`count` points on training rays between estimated depth bounds, and how they were placed."""
    cameras = scene.train
    centers, axes = camera_centers_and_axes(cameras)
    focus = focus_point(centers, axes)
    candidates = count * OVERSAMPLE
    views, origins, dirs, colors = RaySampler(cameras, generator).sample(candidates)
    inverse_depth = False
    if focus.point is not None:
        near, far, how = depth_bounds(cameras, focus, views)
    elif scene.scene_box is None:
        near, far, _, how = fallback_bounds(centers, candidates)
        how = f"cameras do not converge: {focus.reason}; {how}"
        inverse_depth = True
    else:
        near = torch.zeros(candidates, dtype=torch.float64)
        far = torch.full((candidates,), math.inf, dtype=torch.float64)
        how = f"cameras do not converge: {focus.reason}; depths span the capture's box instead"
    if scene.scene_box is not None:
        enter, leave = ray_box(origins, dirs, scene.scene_box)
        clipped_near, clipped_far = torch.maximum(near, enter), torch.minimum(far, leave)
        empty = clipped_near >= clipped_far  # the bounds lie outside the box: the box alone
        near, far = torch.where(empty, enter, clipped_near), torch.where(empty, leave, clipped_far)
        inside = enter < leave
        views, origins, dirs, colors, near, far = (x[inside] for x in (views, origins, dirs, colors, near, far))
        lo, hi = scene.scene_box
        how += (f", clipped to the capture's box ({', '.join(f'{x:.2f}' for x in lo)}) to "
                f"({', '.join(f'{x:.2f}' for x in hi)}) (instant-ngp aabb_scale/scale/offset)")
    share = torch.rand(len(near), generator=generator, dtype=torch.float64)
    if inverse_depth:
        depth = 1.0 / (1.0 / near + share * (1.0 / far - 1.0 / near))
    else:
        depth = near + share * (far - near)
    points = origins + depth[:, None] * dirs
    if len(cameras) >= 2:
        seen = count_views(points, cameras) >= 2
        if int(seen.sum()) >= count // 4:  # otherwise the filter would starve the scene: keep all
            points, colors = points[seen], colors[seen]
    keep = torch.randperm(len(points), generator=generator)[:count]
    return points[keep].float().numpy(), colors[keep].float().numpy(), how


def background_count(points: int, share: float) -> int:
    """How many background points join a capture's `points` at `share` (at most: initial_points
    may place fewer, or none)."""
    return round(share * points) if points > 0 else 0


def background_points(scene: Scene, count: int, generator: torch.Generator) -> Tuple[np.ndarray, np.ndarray, str]:
    """Up to `count` points on training rays beyond the subject (BACKGROUND_DEPTHS x each camera's
    focus distance, uniform in inverse depth, clipped to a declared box), with their pixel's colour;
    and what was done or why nothing was. None where the photos carry alpha (the background is then
    given, not modelled) or the cameras do not converge (no subject distance to go beyond)."""
    def none(why: str) -> Tuple[np.ndarray, np.ndarray, str]:
        return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), f"no background points ({why})"

    cameras = scene.train
    if count <= 0:
        return none("none asked for")
    if any(camera.alpha is not None for camera in cameras):
        return none("the photos have alpha: the background is given")
    focus = focus_point(*camera_centers_and_axes(cameras))
    if focus.point is None:
        return none(focus.reason)
    views, origins, dirs, colors = RaySampler(cameras, generator).sample(count)
    near, far = BACKGROUND_DEPTHS
    share = torch.rand(count, generator=generator, dtype=torch.float64)
    focus_depth = torch.from_numpy(np.maximum(focus.distances, 1e-6))[views]
    depth = focus_depth / (1.0 / near + share * (1.0 / far - 1.0 / near))
    if scene.scene_box is not None:
        enter, leave = ray_box(origins, dirs, scene.scene_box)
        inside = enter < leave
        depth = torch.minimum(depth, leave)
        origins, dirs, colors, depth = (x[inside] for x in (origins, dirs, colors, depth))
    points = origins + depth[:, None] * dirs
    how = (f"{len(points)} background points at {near:g}x to {far:g}x the focus distance"
           + (", inside the capture's box" if scene.scene_box is not None else ""))
    return points.float().numpy(), colors.float().numpy(), how


def initial_points(scene: Scene, count: int, generator: torch.Generator, log: Callable[[str], None] = print,
                   why_count: str = "", background_share: float = 0.0) -> Tuple[np.ndarray, np.ndarray]:
    """(points [P, 3], colours [P, 3] in [0, 1]) to start the Gaussians from: the capture's points and
    `background_share` x as many background points, or `count` points along the rays of a capture
    without points; logs which and why (`why_count`: why that many, when the capture has no points)."""
    if scene.points is None or len(scene.points) == 0:
        points, colors, how = points_along_rays(scene, count, generator)
        reason = f" ({why_count})" if why_count else ""
        log(f"initialisation: {len(points)} points{reason} along the training cameras' rays, as the capture has "
            f"no points; {how}")
        return points, colors
    points = np.asarray(scene.points, dtype=np.float32)
    colors = np.full_like(points, 0.5) if scene.point_colors is None else np.asarray(scene.point_colors, np.float32)
    what = f"the capture's {len(points)} points ({scene.points_source or 'SfM points'})"
    if background_share > 0:
        far, far_colors, how = background_points(scene, background_count(len(points), background_share), generator)
        points, colors = np.concatenate([points, far]), np.concatenate([colors, far_colors])
        what += f" and {how}"
    log(f"initialisation: {what}")
    return points, colors
