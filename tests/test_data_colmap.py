"""COLMAP reader: binary and text layouts, camera models and undistortion, bad files."""

import math
import os
import struct
from pathlib import Path

import cv2
import numpy as np
import pytest
from colmap_writer import write_model

from turbogs.data import colmap
from turbogs.data.colmap import ColmapCamera, ColmapImage
from turbogs.data.load import load_scene
from turbogs.errors import InputError
from turbogs.geometry import quat_to_rotmat, rotmat_to_quat


def real_capture() -> Path:
    env = os.environ.get("TURBOGS_TEST_COLMAP")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared/data/test_colmap"


def random_pose(rng):
    rvec = rng.normal(size=3)
    R, _ = cv2.Rodrigues(rvec)
    return rotmat_to_quat(R), rng.normal(size=3)


def write_scene(root: Path, cameras, n_images=10, binary=True, seed=0, image_size=None):
    """A COLMAP scene with random poses, small random images and a few points."""
    rng = np.random.default_rng(seed)
    images = []
    (root / "images").mkdir(parents=True, exist_ok=True)
    for i in range(n_images):
        camera = cameras[i % len(cameras)]
        qvec, tvec = random_pose(rng)
        name = f"img_{(i * 7) % n_images:03d}.png"
        images.append(ColmapImage(i + 1, qvec, tvec, camera.camera_id, name))
        size = image_size or (camera.width, camera.height)
        pixels = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
        cv2.imwrite(str(root / "images" / name), pixels)
    points = rng.normal(size=(20, 3))
    colors = rng.integers(0, 256, size=(20, 3))
    write_model(root / "sparse" / "0", cameras, images, points, colors, binary=binary)
    return images, points, colors


PINHOLE = ColmapCamera(1, "PINHOLE", 32, 24, np.array([30.0, 31.0, 16.5, 11.5]))
SIMPLE_PINHOLE = ColmapCamera(2, "SIMPLE_PINHOLE", 40, 20, np.array([25.0, 19.0, 10.0]))


# --- parsing -------------------------------------------------------------------------


def test_binary_and_text_models_give_identical_scenes(tmp_path):
    cameras = [PINHOLE, SIMPLE_PINHOLE]
    images, points, colors = write_scene(tmp_path / "bin", cameras, binary=True)
    write_scene(tmp_path / "txt", cameras, binary=False)  # same seed: same images and poses
    a = load_scene(tmp_path / "bin", cache_dir=tmp_path / "cache")
    b = load_scene(tmp_path / "txt", cache_dir=tmp_path / "cache")
    assert [c.name for c in a.train] == [c.name for c in b.train] == sorted(im.name for im in images)
    for ca, cb in zip(a.train, b.train):
        assert (ca.width, ca.height) == (cb.width, cb.height)
        assert np.allclose(ca.K, cb.K) and np.allclose(ca.world_to_cam, cb.world_to_cam, atol=1e-6)
        assert np.array_equal(ca.image, cb.image)
    assert np.allclose(a.points, b.points) and np.allclose(a.points, points, atol=1e-6)
    assert np.allclose(a.point_colors, colors / 255.0) and np.allclose(b.point_colors, colors / 255.0)

    # The pose and intrinsics are those written: K from the model's parameters and
    # world_to_cam = [R(q) | t], with R(q) built independently via Rodrigues.
    by_name = {im.name: im for im in images}
    for camera in a.train:
        written = by_name[camera.name]
        R = camera.world_to_cam[:3, :3].double().numpy()
        assert np.allclose(R, quat_to_rotmat(written.qvec), atol=1e-6)
        assert np.allclose(camera.world_to_cam[:3, 3].numpy(), written.tvec, atol=1e-5)
        model = PINHOLE if written.camera_id == 1 else SIMPLE_PINHOLE
        fx, fy = (model.params[0], model.params[1]) if model is PINHOLE else (model.params[0],) * 2
        cx, cy = model.params[-2:]
        assert np.allclose(camera.K.numpy(), [[fx, 0, cx], [0, fy, cy], [0, 0, 1]])


def test_text_model_as_colmap_writes_it(tmp_path):
    """A hand-written model in COLMAP's text layout, including a 2D-points line with data,
    an empty one, a name with a subfolder, and the header comments COLMAP writes."""
    sparse = tmp_path / "sparse"
    sparse.mkdir()
    (sparse / "cameras.txt").write_text(
        "# Camera list with one line of data per camera:\n"
        "#   CAMERA_ID, MODEL, WIDTH, HEIGHT, PARAMS[]\n"
        "# Number of cameras: 1\n"
        "1 SIMPLE_PINHOLE 8 6 10 4 3\n"
    )
    (sparse / "images.txt").write_text(
        "# Image list with two lines of data per image:\n"
        "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME\n"
        "#   POINTS2D[] as (X, Y, POINT3D_ID)\n"
        "# Number of images: 2, mean observations per image: 1\n"
        "1 1 0 0 0 1 2 3 1 a/one.png\n"
        "2.5 3.5 1\n"
        "2 0 0 0 1 0 0 1 1 two.png\n"
        "\n"
    )
    (sparse / "points3D.txt").write_text(
        "# 3D point list with one line of data per point:\n"
        "#   POINT3D_ID, X, Y, Z, R, G, B, ERROR, TRACK[] as (IMAGE_ID, POINT2D_IDX)\n"
        "1 0.5 -1 2 255 0 51 0.7 1 0\n"
    )
    model = colmap.read_model(sparse)
    assert model.cameras[1].model == "SIMPLE_PINHOLE" and model.cameras[1].width == 8
    assert [im.name for im in model.images] == ["a/one.png", "two.png"]
    assert np.allclose(model.images[0].tvec, [1, 2, 3])
    # qvec (0, 0, 0, 1) is a half turn about z.
    assert np.allclose(colmap.world_to_cam(model.images[1])[:3, :3], np.diag([-1, -1, 1]))
    assert np.allclose(model.points, [[0.5, -1, 2]]) and model.colors.tolist() == [[255, 0, 51]]


def test_real_cameras_bin_matches_an_independent_parse():
    folder = real_capture()
    if not folder.is_dir():
        pytest.skip(f"real COLMAP capture not found at {folder} (set TURBOGS_TEST_COLMAP)")
    data = (folder / "sparse" / "cameras.bin").read_bytes()
    count = int(np.frombuffer(data[:8], dtype="<u8")[0])
    # All cameras there are PINHOLE (4 params): a fixed record layout numpy can read.
    record = np.dtype([("id", "<i4"), ("model", "<i4"), ("w", "<u8"), ("h", "<u8"), ("p", "<f8", 4)])
    records = np.frombuffer(data[8:], dtype=record, count=count)
    cameras = colmap.read_cameras_bin(folder / "sparse" / "cameras.bin")
    assert len(cameras) == count == 23
    for r in records:
        camera = cameras[int(r["id"])]
        assert camera.model == "PINHOLE" and r["model"] == 1
        assert (camera.width, camera.height) == (int(r["w"]), int(r["h"]))
        assert np.array_equal(camera.params, r["p"])


# --- bad files -----------------------------------------------------------------------


def test_every_truncation_of_a_binary_file_is_an_input_error(tmp_path):
    write_scene(tmp_path, [PINHOLE], n_images=2)
    sparse = tmp_path / "sparse" / "0"
    for stem, reader in (("cameras", colmap.read_cameras_bin), ("images", colmap.read_images_bin), ("points3D", colmap.read_points3d_bin)):
        path = sparse / f"{stem}.bin"
        full = path.read_bytes()
        reader(path)  # the intact file reads
        for cut in range(0, len(full), 3):
            path.write_bytes(full[:cut])
            with pytest.raises(InputError, match=str(path)):
                reader(path)
        path.write_bytes(full)


def test_huge_count_is_rejected_before_allocating(tmp_path):
    path = tmp_path / "points3D.bin"
    path.write_bytes(struct.pack("<Q", 2**60) + b"\x00" * 100)
    with pytest.raises(InputError, match=r"points3D.bin.*1152921504606846976 points"):
        colmap.read_points3d_bin(path)
    path = tmp_path / "images.bin"
    path.write_bytes(struct.pack("<Q", 3) + b"\x00" * 80)  # room for one image, not three
    with pytest.raises(InputError, match="images.bin"):
        colmap.read_images_bin(path)


def test_bytes_after_the_declared_records_are_an_error(tmp_path):
    write_scene(tmp_path, [PINHOLE], n_images=2)
    path = tmp_path / "sparse" / "0" / "cameras.bin"
    path.write_bytes(path.read_bytes() + b"\x00" * 8)
    with pytest.raises(InputError, match=r"cameras.bin: 8 bytes left over"):
        colmap.read_cameras_bin(path)


@pytest.mark.parametrize("binary", [True, False])
def test_unsupported_camera_model_names_model_camera_and_file(tmp_path, binary):
    fisheye = ColmapCamera(7, "THIN_PRISM_FISHEYE", 32, 24, np.array([30, 30, 16, 12, 0.1] + [0.0] * 7))
    write_scene(tmp_path, [fisheye], n_images=2, binary=binary)
    suffix = "bin" if binary else "txt"
    with pytest.raises(InputError, match=rf"cameras\.{suffix}: camera 7 uses the THIN_PRISM_FISHEYE model"):
        load_scene(tmp_path)


def test_unknown_model_id_in_binary_file(tmp_path):
    path = tmp_path / "cameras.bin"
    path.write_bytes(struct.pack("<QiiQQ", 1, 3, 99, 4, 4) + b"\x00" * 32)
    with pytest.raises(InputError, match=r"cameras.bin: camera 3 has unknown camera model id 99"):
        colmap.read_cameras_bin(path)


@pytest.mark.parametrize("binary", [True, False])
def test_nan_pose_names_the_image(tmp_path, binary):
    images, _, _ = write_scene(tmp_path, [PINHOLE], n_images=3, binary=binary)
    images[1].tvec = np.array([0.0, float("nan"), 1.0])
    write_model(tmp_path / "sparse" / "0", [PINHOLE], images, np.zeros((0, 3)), np.zeros((0, 3)), binary=binary)
    with pytest.raises(InputError, match=rf"image '{images[1].name}' has a NaN or infinite pose"):
        load_scene(tmp_path)


def test_nan_intrinsics_and_duplicate_names(tmp_path):
    bad = ColmapCamera(1, "PINHOLE", 32, 24, np.array([30.0, float("inf"), 16, 12]))
    images, _, _ = write_scene(tmp_path, [bad], n_images=2)
    with pytest.raises(InputError, match=rf"camera 1 \(of image '{images[0].name}'\) has NaN or infinite intrinsics"):
        load_scene(tmp_path)
    images[1].name = images[0].name
    write_model(tmp_path / "sparse" / "0", [PINHOLE], images, np.zeros((0, 3)), np.zeros((0, 3)))
    with pytest.raises(InputError, match=f"'{images[0].name}' appears more than once"):
        load_scene(tmp_path)


def test_binary_preferred_over_text_and_sparse_without_0(tmp_path):
    """Both layouts in sparse/ (no 0/): the .bin one wins."""
    write_scene(tmp_path, [PINHOLE], n_images=2, binary=True)
    sparse0 = tmp_path / "sparse" / "0"
    other = ColmapCamera(1, "PINHOLE", 32, 24, np.array([99.0, 99.0, 16.0, 12.0]))
    images = colmap.read_images_bin(sparse0 / "images.bin")
    write_model(sparse0, [other], images, np.zeros((0, 3)), np.zeros((0, 3)), binary=False)
    for f in sparse0.iterdir():
        f.rename(tmp_path / "sparse" / f.name)
    sparse0.rmdir()
    scene = load_scene(tmp_path)
    assert float(scene.train[0].K[0, 0]) == 30.0
    (tmp_path / "sparse" / "cameras.bin").unlink()
    scene = load_scene(tmp_path)  # per file: cameras from .txt now
    assert float(scene.train[0].K[0, 0]) == 99.0


# --- camera models and undistortion --------------------------------------------------

W, H = 160, 120
FOCAL = 150.0
CX_CV, CY_CV = 82.5, 57.5  # principal point in OpenCV's convention (pixel centers at integers)

DISTORTED_MODELS = {
    # model: (COLMAP params after f/fx fy cx cy, OpenCV distortion)
    "SIMPLE_RADIAL": ([-0.25], [-0.25, 0, 0, 0]),
    "RADIAL": ([-0.2, 0.05], [-0.2, 0.05, 0, 0]),
    "OPENCV": ([-0.2, 0.03, 0.002, -0.003], [-0.2, 0.03, 0.002, -0.003]),
}


def grid_points():
    """3D points (camera frame = world frame) on a grid that reaches the image's edges."""
    xs = np.linspace(-0.4, 0.4, 5)
    ys = np.linspace(-0.3, 0.3, 4)
    return np.array([[x, y, 1.0] for x in xs for y in ys])


def blob_image(centers, size, sigma=1.0):
    """Gaussian dots at sub-pixel OpenCV coordinates, as uint8."""
    u, v = np.meshgrid(np.arange(size[0]), np.arange(size[1]))
    image = np.zeros((size[1], size[0]))
    for cu, cv in centers:
        image = np.maximum(image, np.exp(-((u - cu) ** 2 + (v - cv) ** 2) / (2 * sigma**2)))
    return np.round(image * 255).astype(np.uint8)


def centroid_near(image, u, v, radius=4):
    """Intensity centroid of the dot near (u, v), in OpenCV pixel coordinates."""
    u0, v0 = int(round(u)), int(round(v))
    window = image[max(v0 - radius, 0) : v0 + radius + 1, max(u0 - radius, 0) : u0 + radius + 1]
    vv, uu = np.mgrid[max(v0 - radius, 0) : v0 + radius + 1, max(u0 - radius, 0) : u0 + radius + 1]
    weights = np.clip(window - 0.2, 0, None)
    return (weights * uu).sum() / weights.sum(), (weights * vv).sum() / weights.sum()


@pytest.mark.parametrize("model", sorted(DISTORTED_MODELS))
def test_distorted_models_are_undistorted_to_the_right_pixels(tmp_path, model):
    extra, dist = DISTORTED_MODELS[model]
    K_cv = np.array([[FOCAL, 0, CX_CV], [0, FOCAL, CY_CV], [0, 0, 1]])
    points = grid_points()
    distorted, _ = cv2.projectPoints(points, np.zeros(3), np.zeros(3), K_cv, np.array(dist, float))
    distorted = distorted.reshape(-1, 2)
    assert (distorted > 2).all() and (distorted[:, 0] < W - 3).all() and (distorted[:, 1] < H - 3).all()

    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.png"), blob_image(distorted, (W, H)))
    # COLMAP's principal point is in its own convention: pixel centers at +0.5.
    cx, cy = CX_CV + 0.5, CY_CV + 0.5
    head = [FOCAL, FOCAL, cx, cy] if model == "OPENCV" else [FOCAL, cx, cy]
    camera = ColmapCamera(1, model, W, H, np.array(head + extra, dtype=float))
    image = ColmapImage(1, np.array([1.0, 0, 0, 0]), np.zeros(3), 1, "a.png")
    write_model(tmp_path / "sparse" / "0", [camera], [image], np.zeros((0, 3)), np.zeros((0, 3)))

    loaded = load_scene(tmp_path).train[0]
    K = loaded.K.double().numpy()
    assert loaded.image.shape == (loaded.height, loaded.width, 3)
    assert not np.allclose(K, [[FOCAL, 0, cx], [0, FOCAL, cy], [0, 0, 1]])  # intrinsics were updated

    # Where the new pinhole camera sees each 3D point, per OpenCV with no distortion.
    K_new_cv = K.copy()
    K_new_cv[:2, 2] -= 0.5
    expected, _ = cv2.projectPoints(points, np.zeros(3), np.zeros(3), K_new_cv, np.zeros(4))
    gray = loaded.image[:, :, 0].numpy()
    checked = 0
    for u, v in expected.reshape(-1, 2):
        if not (4 <= u < loaded.width - 5 and 4 <= v < loaded.height - 5):
            continue  # cropped away by the valid-region crop
        cu, cv = centroid_near(gray, u, v)
        # Measured error is < 0.1 px; a half-pixel convention slip gives about 0.55 px.
        assert math.hypot(cu - u, cv - v) < 0.25, (model, u, v, cu, cv)
        checked += 1
    assert checked >= 8


def test_pinhole_models_are_not_resampled(tmp_path):
    write_scene(tmp_path, [PINHOLE, SIMPLE_PINHOLE], n_images=2)
    scene = load_scene(tmp_path)
    for camera in scene.train:
        stored = cv2.imread(camera.image_path)[:, :, ::-1].astype(np.float32) / 255
        assert np.array_equal(camera.image.numpy(), stored)
