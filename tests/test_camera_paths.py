"""Camera paths against independent geometry: a ring of cameras aimed at a known point, the
Rodrigues formula for rotations, and the definition of slerp (constant angular speed)."""

import math

import numpy as np
import pytest

from turbogs.errors import InputError
from turbogs.geometry import rotmat_to_quat
from turbogs.render.camera_paths import camera_path, catmull_rom, focus_point, look_at, slerp

TARGET = np.array([0.4, -0.3, 2.0])
UP = np.array([0.0, -1.0, 0.0])  # OpenCV-style world: y points down


def ring_poses(count=12, radius=3.0, height=0.8, jitter=0.0, seed=0):
    """Cameras on a circle around TARGET (heights about `height` above it), each aimed at it."""
    rng = np.random.default_rng(seed)
    e1, e2 = np.array([1.0, 0, 0]), np.array([0, 0, 1.0])
    poses = []
    for a in np.linspace(0, 2 * math.pi, count, endpoint=False):
        eye = TARGET + height * UP + radius * (math.cos(a) * e1 + math.sin(a) * e2) + jitter * rng.normal(size=3)
        poses.append(look_at(eye, TARGET, UP))
    return np.stack(poses)


def distance_to_axis(pose, point):
    d = pose[:3, 2]
    rel = point - pose[:3, 3]
    return np.linalg.norm(rel - (rel @ d) * d), rel @ d


def rodrigues(axis, angle):
    axis = np.asarray(axis, float) / np.linalg.norm(axis)
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k


def test_look_at_is_a_right_handed_camera_looking_at_the_target():
    pose = look_at(np.array([1.0, -2.0, -3.0]), TARGET, UP)
    r = pose[:3, :3]
    assert np.allclose(r.T @ r, np.eye(3), atol=1e-12) and np.isclose(np.linalg.det(r), 1.0)
    assert distance_to_axis(pose, TARGET)[0] < 1e-12
    assert -r[:, 1] @ UP > 0  # the image's up is the world's up


def test_focus_is_the_point_all_optical_axes_pass_through():
    assert np.allclose(focus_point(ring_poses()), TARGET, atol=1e-9)


def test_orbit_circles_the_focus_at_the_cameras_mean_distance_and_height():
    poses = ring_poses(count=9, radius=3.0, height=0.8, jitter=0.05)
    frames = camera_path("orbit", poses, 36)
    focus = focus_point(poses)
    up = -poses[:, :3, 1].mean(0)
    up /= np.linalg.norm(up)  # the mean of the cameras' up vectors: UP up to the jitter
    assert up @ UP > 0.999
    heights = (poses[:, :3, 3] - focus) @ up
    radii = np.linalg.norm((poses[:, :3, 3] - focus) - heights[:, None] * up, axis=1)
    angles = []
    for pose in frames:
        miss, ahead = distance_to_axis(pose, focus)
        assert miss < 1e-9 and ahead > 0  # looks straight at the focus
        rel = pose[:3, 3] - focus
        assert math.isclose(rel @ up, heights.mean(), abs_tol=1e-9)
        horizontal = rel - (rel @ up) * up
        assert math.isclose(np.linalg.norm(horizontal), radii.mean(), rel_tol=1e-9)
        assert -pose[:3, 1] @ up > 0  # upright
        angles.append(math.atan2(horizontal @ np.cross(up, [1.0, 0, 0]), horizontal @ [1.0, 0, 0]))
    steps = np.diff(np.unwrap(angles))
    assert np.allclose(np.abs(steps), 2 * math.pi / 36, atol=1e-9)  # evenly spaced, one full turn


def test_spiral_stays_near_the_average_camera_and_looks_at_one_point():
    # forward-facing capture: cameras on a small patch, all looking down +z
    rng = np.random.default_rng(1)
    poses = np.stack([look_at(np.array([x, y, 0.0]), np.array([0, 0, 5.0]), UP)
                      for x, y in rng.uniform(-0.5, 0.5, (10, 2))])
    frames = camera_path("spiral", poses, 40)
    target_points = []
    for pose in frames:
        assert np.linalg.norm(pose[:3, 3] - poses[:, :3, 3].mean(0)) < 1.5
        target_points.append(pose[:3, 3] + pose[:3, 2] * (5.0 - pose[2, 3]) / pose[2, 2])
    assert np.allclose(target_points, target_points[0], atol=1e-6)  # one common look-at point
    assert np.ptp([p[:3, 3] for p in frames], axis=0)[:2].min() > 0.3  # it actually moves


def test_interpolate_passes_through_every_training_camera():
    poses = ring_poses(count=5, jitter=0.3, seed=2)
    per_segment = 6
    frames = camera_path("interpolate", poses, (len(poses) - 1) * per_segment + 1)
    for k, pose in enumerate(poses):
        assert np.allclose(frames[k * per_segment], pose, atol=1e-9)
    for pose in frames:
        r = pose[:3, :3]
        assert np.allclose(r.T @ r, np.eye(3), atol=1e-9) and np.isclose(np.linalg.det(r), 1.0)


def test_interpolate_positions_follow_the_catmull_rom_spline():
    p = [np.array(v, float) for v in ([0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 1])]
    assert np.allclose(catmull_rom(*p, 0.0), p[1]) and np.allclose(catmull_rom(*p, 1.0), p[2])
    # the tangent at p1 is (p2 - p0) / 2 (the defining property), by central differences
    h = 1e-6
    tangent = (catmull_rom(*p, h) - catmull_rom(*p, -h)) / (2 * h)
    assert np.allclose(tangent, (p[2] - p[0]) / 2, atol=1e-5)


def test_slerp_moves_at_constant_angular_speed_on_unit_quaternions():
    q0 = rotmat_to_quat(rodrigues([0, 1, 0], 0.2))
    q1 = rotmat_to_quat(rodrigues([1, 1, 0], 2.0))
    total = 2 * math.acos(abs(float(q0 @ q1)))
    for t in np.linspace(0, 1, 11):
        q = slerp(q0, q1, t)
        assert math.isclose(np.linalg.norm(q), 1.0, abs_tol=1e-12)
        assert math.isclose(2 * math.acos(min(1.0, abs(float(q0 @ q)))), t * total, abs_tol=1e-6)
    assert np.allclose(slerp(q0, -q1, 0.5), slerp(q0, q1, 0.5))  # q and -q: the same short way


@pytest.mark.parametrize("count", [0, 1])
def test_interpolate_needs_two_cameras(count):
    with pytest.raises(InputError, match="at least 2 cameras|no cameras"):
        camera_path("interpolate", ring_poses(count=3)[:count], 10)
