"""Quaternions against the axis-angle formula and OpenCV's Rodrigues, and the nearest point to
lines against points built to lie on them."""

import math

import cv2
import numpy as np

from turbogs.geometry import nearest_point_to_lines, normalize, quat_to_rotmat, rotmat_to_quat


def test_quaternions_match_axis_angle_both_ways():
    rng = np.random.default_rng(1)
    for _ in range(50):
        axis = normalize(rng.normal(size=3))
        angle = rng.uniform(-math.pi, math.pi)
        q = np.concatenate([[math.cos(angle / 2)], math.sin(angle / 2) * axis])
        R, _ = cv2.Rodrigues(axis * angle)
        assert np.allclose(quat_to_rotmat(q), R, atol=1e-9)
        assert np.allclose(quat_to_rotmat(3.0 * q), R, atol=1e-9)  # normalised first
        back = rotmat_to_quat(R)
        assert math.isclose(np.linalg.norm(back), 1.0, abs_tol=1e-12) and back[0] >= 0
        assert np.allclose(quat_to_rotmat(back), R, atol=1e-9)
        assert math.isclose(2 * math.acos(min(1.0, back[0])), abs(angle), abs_tol=1e-6)


def test_half_turns_convert_both_ways():
    for R in (np.diag([-1.0, -1.0, 1.0]), np.diag([1.0, -1.0, -1.0]), np.diag([-1.0, 1.0, -1.0])):
        assert np.allclose(quat_to_rotmat(rotmat_to_quat(R)), R, atol=1e-12)


def test_batched_quaternions_keep_their_dtype():
    quats = np.random.default_rng(2).normal(size=(5, 7, 4)).astype(np.float32)
    rotations = quat_to_rotmat(quats, dtype=np.float32)
    assert rotations.shape == (5, 7, 3, 3) and rotations.dtype == np.float32
    assert np.allclose(rotations[2, 3], quat_to_rotmat(quats[2, 3].astype(np.float64)), atol=1e-6)


def test_the_nearest_point_of_lines_through_one_point_is_that_point():
    rng = np.random.default_rng(3)
    target = np.array([0.4, -0.3, 2.0])
    dirs = normalize(rng.normal(size=(9, 3)))
    origins = target - dirs * rng.uniform(1, 5, size=(9, 1))
    assert np.allclose(nearest_point_to_lines(origins, dirs), target, atol=1e-9)


def test_the_nearest_point_minimises_the_summed_squared_distance():
    rng = np.random.default_rng(4)
    origins, dirs = rng.normal(size=(6, 3)), normalize(rng.normal(size=(6, 3)))

    def cost(p):
        offsets = p - origins
        along = np.einsum("ni,ni->n", offsets, dirs)
        return float(((offsets - along[:, None] * dirs) ** 2).sum())

    best = nearest_point_to_lines(origins, dirs)
    for step in rng.normal(size=(20, 3)) * 1e-3:
        assert cost(best) <= cost(best + step)


def test_parallel_lines_and_a_single_line_meet_nowhere():
    dirs = np.tile([0.0, 0.0, 1.0], (4, 1))
    assert nearest_point_to_lines(np.random.default_rng(5).normal(size=(4, 3)), dirs) is None
    assert nearest_point_to_lines(np.zeros((1, 3)), dirs[:1]) is None
