"""Fisheye cameras (COLMAP OPENCV_FISHEYE, RADIAL_FISHEYE, SIMPLE_RADIAL_FISHEYE; transforms.json
camera_model OPENCV_FISHEYE) are undistorted on load into pinhole views.

The independent check: the captures are rendered by scenes/'s numpy ray caster through the fisheye
model's own definition (no OpenCV), and each undistorted view must match what the same ray caster
sees through a pinhole camera with the loaded K and pose. Loading the same images as if they were
pinhole must fail that comparison, so the test sees a loader that skips the undistortion.
"""

import importlib.util
import math
import sys

import numpy as np
import pytest
from conftest import REPO

from turbogs.data import colmap
from turbogs.data.images import make_undistortion
from turbogs.data.load import load_scene
from turbogs.errors import InputError

_spec = importlib.util.spec_from_file_location("make_captures", REPO / "scenes" / "make_captures.py")
captures = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_captures", captures)
_spec.loader.exec_module(captures)

MATCH_DB = 28.0  # the undistorted views score 32-34 dB (bilinear resampling); unmodelled ones far less


def psnr_against_pinhole_renders(scene) -> list:
    primitives = captures.demo.demo_primitives()
    scores = []
    for camera in scene.train:
        truth, _ = captures.render(primitives, camera.world_to_cam.double().numpy(), camera.K.double().numpy(),
                                   camera.width, camera.height)
        scores.append(-10 * math.log10(float(((camera.image.numpy() - truth) ** 2).mean())))
    return scores


@pytest.fixture(scope="module")
def fisheye_captures(tmp_path_factory):
    root = tmp_path_factory.mktemp("fisheye")
    return {name: captures.make_capture(name, str(root)) for name in ("fisheye", "fisheye_json")}


@pytest.mark.parametrize("name", ["fisheye", "fisheye_json"])
@pytest.mark.parametrize("resolution", [None, 2])
def test_undistorted_fisheye_views_are_what_a_pinhole_camera_sees(fisheye_captures, name, resolution):
    scene = load_scene(fisheye_captures[name], resolution=resolution, log=lambda _: None)
    assert len(scene.train) == captures.FISHEYE_VIEWS
    scores = psnr_against_pinhole_renders(scene)
    assert min(scores) > MATCH_DB, scores
    # the valid-region crop: no black border is left (the sky and ground fill every edge)
    for camera in scene.train:
        image = camera.image.numpy()
        edges = np.concatenate([image[0], image[-1], image[:, 0], image[:, -1]])
        assert edges.sum(axis=1).min() > 0.3


def test_the_same_images_read_as_pinhole_do_not_match(tmp_path):
    """The comparison above is sharp: ignoring the fisheye model scores far below it."""
    folder = captures.make_capture("fisheye", str(tmp_path))
    cameras = (tmp_path / "fisheye" / "sparse" / "0" / "cameras.txt")
    fx, fy, cx, cy = captures.FISHEYE_PARAMS[:4]
    cameras.write_text(f"1 PINHOLE {captures.FISHEYE_WIDTH} {captures.FISHEYE_HEIGHT} {fx} {fy} {cx} {cy}\n")
    scores = psnr_against_pinhole_renders(load_scene(folder, log=lambda _: None))
    assert max(scores) < MATCH_DB - 5, scores


@pytest.mark.parametrize("model, params", [
    ("SIMPLE_RADIAL_FISHEYE", (44.0, 44.0, 47.2, 36.6, 0.05, 0.0, 0.0, 0.0)),
    ("RADIAL_FISHEYE", (44.0, 44.0, 47.2, 36.6, 0.05, -0.012, 0.0, 0.0)),
    ("OPENCV_FISHEYE", (40.0, 40.0, 48.0, 36.0, 0.0, 0.0, 0.0, 0.0)),  # equidistant: all k zero is still a fisheye
])
def test_colmaps_smaller_fisheye_models(tmp_path, model, params):
    captures.make_fisheye(str(tmp_path), as_json=False, model=model, params=params)
    scores = psnr_against_pinhole_renders(load_scene(tmp_path, log=lambda _: None))
    assert min(scores) > MATCH_DB, scores


def test_the_undistortion_map_follows_the_fisheye_definition():
    """Every output pixel's source, from the map, against the model's formula written out here:
    the ray through the output pixel (new K, +0.5 centres) at angle theta lands at radius
    f * theta (1 + k1 theta^2 + ... + k4 theta^8) in the source image."""
    fx, fy, cx, cy, *k = captures.FISHEYE_PARAMS
    K = np.array([[fx, 0, cx], [0, fy, cy], [0, 0, 1.0]])
    w, h = captures.FISHEYE_WIDTH, captures.FISHEYE_HEIGHT
    und = make_undistortion(K, k, (w, h), fisheye=True)
    rx, ry, rw, rh = und.roi
    assert rw > 0.9 * w and rh > 0.9 * h
    jj, ii = np.meshgrid(np.arange(rh), np.arange(rw), indexing="ij")
    x = (ii + 0.5 - und.K[0, 2]) / und.K[0, 0]
    y = (jj + 0.5 - und.K[1, 2]) / und.K[1, 1]
    r = np.hypot(x, y)
    theta = np.arctan(r)
    theta_d = theta * (1 + k[0] * theta**2 + k[1] * theta**4 + k[2] * theta**6 + k[3] * theta**8)
    scale = theta_d / np.maximum(r, 1e-12)
    u, v = fx * x * scale + cx, fy * y * scale + cy
    assert np.abs(und.map_x[ry:ry + rh, rx:rx + rw] + 0.5 - u).max() < 0.02
    assert np.abs(und.map_y[ry:ry + rh, rx:rx + rw] + 0.5 - v).max() < 0.02
    # every kept pixel comes from inside the source image
    assert und.map_x[ry:ry + rh, rx:rx + rw].min() >= -0.01 and und.map_x[ry:ry + rh, rx:rx + rw].max() <= w - 0.99


def test_colmap_fisheye_intrinsics():
    def camera(model, params):
        return colmap.ColmapCamera(1, model, 96, 72, np.array(params, dtype=float))

    K, dist = colmap.intrinsics(camera("SIMPLE_RADIAL_FISHEYE", [40, 48, 36, 0.1]))
    assert K[0, 0] == K[1, 1] == 40 and dist.tolist() == [0.1, 0, 0, 0]
    K, dist = colmap.intrinsics(camera("RADIAL_FISHEYE", [40, 48, 36, 0.1, -0.2]))
    assert dist.tolist() == [0.1, -0.2, 0, 0]
    K, dist = colmap.intrinsics(camera("OPENCV_FISHEYE", [40, 41, 48, 36, 0.1, -0.2, 0.3, -0.4]))
    assert (K[0, 0], K[1, 1], K[0, 2], K[1, 2]) == (40, 41, 48, 36) and dist.tolist() == [0.1, -0.2, 0.3, -0.4]


def test_a_fisheye_that_cannot_become_a_pinhole_is_one_clear_error():
    K = np.array([[20.0, 0, 48], [0, 20, 36], [0, 0, 1]])  # the edges lie beyond 90 degrees off axis
    with pytest.raises(InputError, match="cannot be undistorted to a pinhole"):
        make_undistortion(K, [0.0, 0.0, 0.0, 0.0], (96, 72), fisheye=True)
