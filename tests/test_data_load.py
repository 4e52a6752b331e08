"""load_scene: format detection, images and their sizes, the split, caching, masks."""

import os
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from colmap_writer import write_model

from turbogs.data import colmap
from turbogs.data.colmap import ColmapCamera, ColmapImage
from turbogs.data.load import load_scene
from turbogs.errors import InputError


def real_capture() -> Path:
    env = os.environ.get("TURBOGS_TEST_COLMAP")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared/data/test_colmap"


def make_scene(root: Path, names, size=(32, 24), params=(30.0, 31.0, 16.0, 12.0), seed=0, write_images=True):
    """A PINHOLE COLMAP scene whose images are random pixels; returns {name: pixels (BGR)}."""
    rng = np.random.default_rng(seed)
    camera = ColmapCamera(1, "PINHOLE", size[0], size[1], np.array(params, dtype=float))
    images, pixels = [], {}
    (root / "images").mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        images.append(ColmapImage(i + 1, np.array([1.0, 0, 0, 0]), np.array([0.0, 0.0, float(i)]), 1, name))
        pixels[name] = rng.integers(0, 256, size=(size[1], size[0], 3), dtype=np.uint8)
        if write_images:
            (root / "images" / name).parent.mkdir(parents=True, exist_ok=True)
            cv2.imwrite(str(root / "images" / name), pixels[name])
    write_model(root / "sparse" / "0", [camera], images, np.zeros((1, 3)), np.full((1, 3), 255))
    return pixels


def as_rgb_float(bgr):
    return bgr[:, :, ::-1].astype(np.float32) / 255.0


def quiet(_message):
    pass


# --- finding the scene ---------------------------------------------------------------


def test_missing_or_unrecognised_folder(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        load_scene(tmp_path / "nope")
    with pytest.raises(InputError, match=r"sparse/0/ or sparse/ \(COLMAP\), transforms_train.json .* transforms.json"):
        load_scene(tmp_path)
    (tmp_path / "sparse").mkdir()
    with pytest.raises(InputError, match="no COLMAP model"):
        load_scene(tmp_path)
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(InputError, match="not a folder"):
        load_scene(tmp_path / "file.txt")


def test_bad_options(tmp_path):
    make_scene(tmp_path, ["a.png"])
    for resolution in (0, 3, -1, 2.5):
        with pytest.raises(InputError, match="resolution"):
            load_scene(tmp_path, resolution=resolution)
    with pytest.raises(InputError, match="test_every"):
        load_scene(tmp_path, test_every=0)


# --- images --------------------------------------------------------------------------


def test_subfolder_names_and_pixels(tmp_path):
    pixels = make_scene(tmp_path, ["b.png", "sub/a.png"])
    scene = load_scene(tmp_path)
    assert [c.name for c in scene.train] == ["b.png", "sub/a.png"]
    for camera in scene.train:
        assert camera.image.dtype.is_floating_point and camera.image.shape == (24, 32, 3)
        assert np.array_equal(camera.image.numpy(), as_rgb_float(pixels[camera.name]))
        assert camera.mask is None


def test_image_missing_on_disk_is_named(tmp_path):
    make_scene(tmp_path, ["a.png", "b.png"])
    (tmp_path / "images" / "b.png").unlink()
    with pytest.raises(InputError, match=r"image 'b.png' of the COLMAP model .* is missing from"):
        load_scene(tmp_path)
    with pytest.raises(InputError, match="images folder .*other not found"):
        load_scene(tmp_path, images="other")


def test_images_option_picks_another_folder(tmp_path):
    make_scene(tmp_path, ["a.png"])
    (tmp_path / "images").rename(tmp_path / "rgb")
    assert load_scene(tmp_path, images="rgb").train[0].image_path.endswith("rgb/a.png")


def test_image_size_must_match_its_camera(tmp_path):
    make_scene(tmp_path, ["a.png", "b.png"])
    cv2.imwrite(str(tmp_path / "images" / "b.png"), np.zeros((20, 30, 3), np.uint8))
    with pytest.raises(InputError, match=r"images/b.png is 30x20 px but its camera says 32x24 px"):
        load_scene(tmp_path)


def test_corrupt_image_is_named(tmp_path):
    make_scene(tmp_path, ["a.png", "b.png"])
    (tmp_path / "images" / "b.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    with pytest.raises(InputError, match=r"cannot read image .*images/b.png"):
        load_scene(tmp_path)


def test_grayscale_and_16_bit_images(tmp_path):
    make_scene(tmp_path, ["gray.png", "deep.png"])
    rng = np.random.default_rng(3)
    gray = rng.integers(0, 256, size=(24, 32), dtype=np.uint8)
    deep = rng.integers(0, 65536, size=(24, 32, 3), dtype=np.uint16)
    cv2.imwrite(str(tmp_path / "images" / "gray.png"), gray)
    cv2.imwrite(str(tmp_path / "images" / "deep.png"), deep)
    cameras = {c.name: c for c in load_scene(tmp_path).train}
    image = cameras["gray.png"].image.numpy()
    assert np.allclose(image, (gray / 255.0)[:, :, None].repeat(3, axis=2))
    assert np.allclose(cameras["deep.png"].image.numpy(), deep[:, :, ::-1] / 65535.0)
    assert cameras["deep.png"].image.max() <= 1.0


# --- the split -----------------------------------------------------------------------


def test_eval_split_takes_every_nth_view_in_name_order(tmp_path):
    names = [f"v{i:02d}.png" for i in range(20)]
    rng = np.random.default_rng(1)
    make_scene(tmp_path, list(rng.permutation(names)))  # model order is not name order
    scene = load_scene(tmp_path, eval_split=True)
    assert [c.name for c in scene.test] == ["v00.png", "v08.png", "v16.png"]
    assert [c.name for c in scene.train] == [n for i, n in enumerate(names) if i % 8]
    scene = load_scene(tmp_path, eval_split=True, test_every=5)
    assert [c.name for c in scene.test] == ["v00.png", "v05.png", "v10.png", "v15.png"]
    scene = load_scene(tmp_path)
    assert scene.test == [] and [c.name for c in scene.train] == names


# --- resolution ----------------------------------------------------------------------


def test_existing_images_n_folder_is_used_and_its_size_sets_the_scale(tmp_path):
    make_scene(tmp_path, ["a.png"], size=(32, 24), params=(30.0, 31.0, 16.0, 12.0))
    (tmp_path / "images_2").mkdir()
    (tmp_path / "images_4").mkdir()
    cv2.imwrite(str(tmp_path / "images_2" / "a.png"), np.full((12, 16, 3), 77, np.uint8))
    cv2.imwrite(str(tmp_path / "images_4" / "a.png"), np.full((6, 9, 3), 99, np.uint8))  # 9 = 8 + 1 px rounding

    camera = load_scene(tmp_path, resolution=2, cache_dir=tmp_path / "cache").train[0]
    assert camera.image_path.endswith("images_2/a.png") and (camera.width, camera.height) == (16, 12)
    assert np.allclose(camera.image.numpy(), 77 / 255.0)
    assert np.allclose(camera.K.numpy(), [[15.0, 0, 8.0], [0, 15.5, 6.0], [0, 0, 1]])

    camera = load_scene(tmp_path, resolution=4, cache_dir=tmp_path / "cache").train[0]
    sx, sy = 9 / 32, 6 / 24
    assert np.allclose(camera.K.numpy(), [[30 * sx, 0, 16 * sx], [0, 31 * sy, 12 * sy], [0, 0, 1]])
    assert not (tmp_path / "cache").exists()  # nothing was downscaled, nothing cached

    cv2.imwrite(str(tmp_path / "images_2" / "a.png"), np.zeros((12, 20, 3), np.uint8))
    with pytest.raises(InputError, match=r"images_2/a.png is 20x12 px, but the camera of 'a.png' is 32x24 px"):
        load_scene(tmp_path, resolution=2)


def test_only_images_n_present(tmp_path):
    make_scene(tmp_path, ["a.png"], write_images=False)
    (tmp_path / "images_8").mkdir()
    cv2.imwrite(str(tmp_path / "images_8" / "a.png"), np.zeros((3, 4, 3), np.uint8))
    assert load_scene(tmp_path, resolution=8).train[0].width == 4
    with pytest.raises(InputError, match="missing from"):
        load_scene(tmp_path)  # full resolution needs images/


def test_downscale_on_load_is_cached(tmp_path):
    pixels = make_scene(tmp_path, ["a.png"], size=(32, 24))
    cache = tmp_path / "cache"
    camera = load_scene(tmp_path, resolution=4, cache_dir=cache).train[0]
    expected = cv2.resize(pixels["a.png"], (8, 6), interpolation=cv2.INTER_AREA)
    assert np.array_equal(camera.image.numpy(), as_rgb_float(expected))
    assert np.allclose(camera.K.numpy(), [[7.5, 0, 4.0], [0, 7.75, 3.0], [0, 0, 1]])
    cached = cache / "images_4" / "a.png.png"
    assert np.array_equal(cv2.imread(str(cached)), expected)

    # A second load reads the cache, not the original: prove it with a marked cache file.
    marked = np.full((6, 8, 3), 200, np.uint8)
    cv2.imwrite(str(cached), marked)
    assert np.allclose(load_scene(tmp_path, resolution=4, cache_dir=cache).train[0].image.numpy(), 200 / 255.0)
    # A source newer than its cached copy invalidates it.
    later = cached.stat().st_mtime + 10
    os.utime(tmp_path / "images" / "a.png", (later, later))
    camera = load_scene(tmp_path, resolution=4, cache_dir=cache).train[0]
    assert np.array_equal(camera.image.numpy(), as_rgb_float(expected))


def test_default_cache_location_and_unwritable_fallback(tmp_path, monkeypatch):
    make_scene(tmp_path, ["a.png"])
    reference = load_scene(tmp_path, resolution=2).train[0].image
    assert (tmp_path / ".turbogs_cache" / "images_2" / "a.png.png").is_file()

    # A cache folder that cannot be created (a file is in the way, which stops even root)
    # falls back to the temp dir; one that is not there either means no cache.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    blocker = tmp_path / "blocker"
    blocker.write_text("a file where the cache folder should go")
    messages = []
    scene = load_scene(tmp_path, resolution=2, cache_dir=blocker / "cache", log=messages.append)
    assert np.array_equal(scene.train[0].image, reference)
    assert len([m for m in messages if "not writable; caching downscaled images in" in m]) == 1
    assert len(list((tmp_path / "tmp" / "turbogs_cache").rglob("a.png.png"))) == 1

    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))
    messages.clear()
    scene = load_scene(tmp_path, resolution=2, cache_dir=blocker / "cache", log=messages.append)
    assert np.array_equal(scene.train[0].image, reference)
    assert messages == [f"cache folder {blocker / 'cache' / 'images_2'} is not writable; not caching downscaled images"]


def test_target_width_resolution(tmp_path):
    make_scene(tmp_path, ["a.png"], size=(32, 24))
    camera = load_scene(tmp_path, resolution=16, cache_dir=tmp_path / "c").train[0]
    assert (camera.width, camera.height) == (16, 12)
    assert np.allclose(camera.K.numpy(), [[15.0, 0, 8.0], [0, 15.5, 6.0], [0, 0, 1]])
    assert (tmp_path / "c" / "images_w16" / "a.png.png").is_file()


def test_wide_images_are_capped_with_one_message(tmp_path):
    make_scene(tmp_path, ["a.png", "b.png", "c.png"], size=(40, 20), params=(40.0, 40.0, 20.0, 10.0))
    messages = []
    scene = load_scene(tmp_path, max_width=20, cache_dir=tmp_path / "c", log=messages.append)
    assert all((c.width, c.height) == (20, 10) for c in scene.train)
    assert np.allclose(scene.train[0].K.numpy(), [[20.0, 0, 10.0], [0, 20.0, 5.0], [0, 0, 1]])
    capped = [m for m in messages if "20 px wide" in m]
    assert len(capped) == 1 and "3 of 3" in capped[0]

    messages.clear()
    scene = load_scene(tmp_path, max_width=40, log=messages.append)
    assert scene.train[0].width == 40 and messages == []
    scene = load_scene(tmp_path, resolution=1, max_width=20, log=messages.append)
    assert scene.train[0].width == 40 and messages == []


# --- masks and alpha -----------------------------------------------------------------


def test_alpha_channel_becomes_the_mask(tmp_path):
    make_scene(tmp_path, ["a.png"])
    rgba = np.zeros((24, 32, 4), np.uint8)
    rgba[:, :, 2] = 255  # red in BGRA
    rgba[:, :, 3] = np.linspace(0, 255, 32, dtype=np.uint8)[None, :]
    cv2.imwrite(str(tmp_path / "images" / "a.png"), rgba)
    camera = load_scene(tmp_path).train[0]
    assert np.array_equal(camera.mask.numpy(), (rgba[:, :, 3] / 255.0 > 0.5).astype(np.float32))
    assert np.allclose(camera.image.numpy(), [1.0, 0.0, 0.0])  # RGB kept, not composited


@pytest.mark.parametrize("mask_name", ["a.png", "a.jpg", "a.jpeg.png"])
def test_mask_files_beside_the_images(tmp_path, mask_name):
    make_scene(tmp_path, ["a.jpeg", "b.jpeg"])
    (tmp_path / "masks").mkdir()
    values = np.zeros((24, 32), np.uint8)
    values[4:12, 8:24] = 255
    cv2.imwrite(str(tmp_path / "masks" / mask_name), values)
    scene = load_scene(tmp_path)
    cameras = {c.name: c for c in scene.train}
    assert np.array_equal(cameras["a.jpeg"].mask.numpy(), (values > 127).astype(np.float32))
    assert cameras["b.jpeg"].mask is None  # no mask file: every pixel counts

    # A full-resolution mask follows the image to a lower resolution.
    low = load_scene(tmp_path, resolution=2, cache_dir=tmp_path / "c").train[0]
    expected = cv2.resize(values.astype(np.float32) / 255, (16, 12), interpolation=cv2.INTER_AREA) > 0.5
    assert np.array_equal(low.mask.numpy(), expected.astype(np.float32))

    cv2.imwrite(str(tmp_path / "masks" / mask_name), np.zeros((10, 10), np.uint8))
    with pytest.raises(InputError, match=r"mask .* is 10x10 px but image 'a.jpeg' is 32x24 px"):
        load_scene(tmp_path)


def test_mask_file_and_alpha_combine(tmp_path):
    make_scene(tmp_path, ["a.png"])
    rgba = np.full((24, 32, 4), 255, np.uint8)
    rgba[:, :16, 3] = 0  # left half transparent
    cv2.imwrite(str(tmp_path / "images" / "a.png"), rgba)
    (tmp_path / "masks").mkdir()
    values = np.full((24, 32), 255, np.uint8)
    values[:12] = 0  # top half masked
    cv2.imwrite(str(tmp_path / "masks" / "a.png"), values)
    mask = load_scene(tmp_path).train[0].mask.numpy()
    expected = np.zeros((24, 32), np.float32)
    expected[12:, 16:] = 1
    assert np.array_equal(mask, expected)


# --- the real capture ----------------------------------------------------------------


def test_real_capture_at_resolution_8(tmp_path):
    folder = real_capture()
    if not folder.is_dir():
        pytest.skip(f"real COLMAP capture not found at {folder} (set TURBOGS_TEST_COLMAP)")
    start = time.perf_counter()
    scene = load_scene(folder, resolution=8, eval_split=True, cache_dir=tmp_path, log=quiet)
    seconds = time.perf_counter() - start
    assert len(scene.cameras) == 23 and len(scene.test) == 3 and len(scene.train) == 20
    names = sorted(p.name for p in (folder / "images").iterdir())
    assert [c.name for c in scene.test] == names[::8]
    assert scene.points is not None and scene.points.shape[1] == 3 and len(scene.points) > 100
    assert scene.points.dtype == np.float32 and 0 <= scene.point_colors.min() <= scene.point_colors.max() <= 1
    assert seconds < 10, f"loading took {seconds:.1f} s"

    cameras = colmap.read_cameras_bin(folder / "sparse" / "cameras.bin")
    images = {im.name: im for im in colmap.read_images_bin(folder / "sparse" / "images.bin")}
    for camera in scene.cameras:
        source = cameras[images[camera.name].camera_id]
        assert camera.image.shape == (camera.height, camera.width, 3)
        assert camera.width == round(source.width / 8) and camera.height == round(source.height / 8)
        fx, fy, cx, cy = source.params
        sx, sy = camera.width / source.width, camera.height / source.height
        assert np.allclose(camera.K.numpy(), [[fx * sx, 0, cx * sx], [0, fy * sy, cy * sy], [0, 0, 1]], rtol=1e-5)

    # Poses are world-to-camera with z forward: most SfM points lie in front of each camera.
    centers = np.stack([c.center.numpy() for c in scene.cameras])
    assert np.isfinite(centers).all() and scene.extent() > 0
    in_front = []
    for camera in scene.cameras:
        R, t = camera.world_to_cam[:3, :3].numpy(), camera.world_to_cam[:3, 3].numpy()
        depth = (scene.points @ R.T + t)[:, 2]
        in_front.append((depth > 0).mean())
    assert np.median(in_front) > 0.9
