"""transforms.json readers: NeRF-synthetic and instant-ngp / nerfstudio."""

import json
import math
from pathlib import Path

import cv2
import numpy as np
import pytest
from plyfile import PlyData, PlyElement

from turbogs.data.images import make_undistortion
from turbogs.data.load import load_scene
from turbogs.errors import InputError

SIZE = 40
FOCAL = 50.0
ANGLE_X = 2 * math.atan(0.5 * SIZE / FOCAL)


def translation(x, y, z):
    m = np.eye(4)
    m[:3, 3] = (x, y, z)
    return m


def looking_from_plus_x():
    """Blender camera at (4, 0, 0) looking at the origin with world +z up: its right (x)
    is world +y, its up (y) is world +z, and its back (z) is world +x."""
    m = np.eye(4)
    m[:3, 0], m[:3, 1], m[:3, 2], m[:3, 3] = (0, 1, 0), (0, 0, 1), (1, 0, 0), (4, 0, 0)
    return m


def write_rgba(path: Path, rgba_bgra: np.ndarray):
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), rgba_bgra)


def write_blender(root: Path, poses, split="train", angle=ANGLE_X):
    frames = []
    for i, pose in enumerate(poses):
        image = np.zeros((SIZE, SIZE, 4), np.uint8)
        image[:, :, 2] = 255  # red (BGRA)
        image[:, :, 3] = 128  # half transparent
        write_rgba(root / split / f"r_{i}.png", image)
        frames.append({"file_path": f"./{split}/r_{i}", "rotation": 0.0, "transform_matrix": pose.tolist()})
    (root / f"transforms_{split}.json").write_text(json.dumps({"camera_angle_x": angle, "frames": frames}))


def project(camera, point):
    p = camera.world_to_cam.double().numpy() @ np.append(point, 1.0)
    K = camera.K.double().numpy()
    return K[0, 0] * p[0] / p[2] + K[0, 2], K[1, 1] * p[1] / p[2] + K[1, 2], p[2]


# --- NeRF-synthetic ------------------------------------------------------------------


def test_nerf_synthetic_camera_sees_a_world_point_where_blender_would(tmp_path):
    write_blender(tmp_path, [translation(0, 0, 4), looking_from_plus_x()])
    scene = load_scene(tmp_path)
    front, side = scene.train
    assert np.allclose(front.K.numpy(), [[FOCAL, 0, 20], [0, FOCAL, 20], [0, 0, 1]], atol=1e-4)
    assert np.allclose(front.center.numpy(), [0, 0, 4]) and np.allclose(side.center.numpy(), [4, 0, 0])
    # The front camera looks down -z with +y up: a point right of and above the origin
    # lands right of and above the image center (image v grows downward).
    u, v, depth = project(front, np.array([0.5, 0.25, 0.0]))
    assert depth == pytest.approx(4.0) and (u, v) == pytest.approx((20 + 50 * 0.5 / 4, 20 - 50 * 0.25 / 4))
    # From +x, world +y is to the right and world +z is up.
    u, v, depth = project(side, np.array([0.0, 1.0, 0.5]))
    assert depth == pytest.approx(4.0) and (u, v) == pytest.approx((20 + 50 / 4, 20 - 50 * 0.5 / 4))
    assert scene.points is None

    half = load_scene(tmp_path, resolution=2).train[1]
    assert (half.width, half.height) == (20, 20)
    assert project(half, np.array([0.0, 1.0, 0.5]))[:2] == pytest.approx(((20 + 50 / 4) / 2, (20 - 50 * 0.5 / 4) / 2))


@pytest.mark.parametrize("white", [False, True])
def test_nerf_synthetic_alpha_is_composited_not_masked(tmp_path, white):
    write_blender(tmp_path, [translation(0, 0, 4)])
    scene = load_scene(tmp_path, white_background=white)
    camera = scene.train[0]
    alpha = 128 / 255
    background = 1.0 if white else 0.0
    expected = [alpha + (1 - alpha) * background, (1 - alpha) * background, (1 - alpha) * background]
    assert np.allclose(camera.image.numpy(), expected, atol=1e-6)
    assert camera.mask is None and scene.white_background is white
    assert np.allclose(camera.alpha.numpy(), alpha)  # kept, to composite onto other backgrounds


def test_nerf_synthetic_uses_its_test_file_for_the_split(tmp_path):
    write_blender(tmp_path, [translation(0, 0, 4 + i) for i in range(3)], "train")
    write_blender(tmp_path, [translation(0, 0, 9 + i) for i in range(2)], "test")
    (tmp_path / "transforms_val.json").write_text("not even json")  # ignored
    scene = load_scene(tmp_path, eval_split=True)
    assert [c.name for c in scene.train] == ["train/r_0.png", "train/r_1.png", "train/r_2.png"]
    assert [c.name for c in scene.test] == ["test/r_0.png", "test/r_1.png"]
    scene = load_scene(tmp_path)
    assert len(scene.train) == 3 and scene.test == []

    (tmp_path / "transforms_test.json").unlink()
    messages = []
    scene = load_scene(tmp_path, eval_split=True, test_every=2, log=messages.append)
    assert [c.name for c in scene.test] == ["train/r_0.png", "train/r_2.png"]
    assert any("no transforms_test.json" in m for m in messages)


def test_missing_frames_are_skipped_with_one_counting_warning(tmp_path):
    write_blender(tmp_path, [translation(0, 0, 4 + i) for i in range(5)])
    (tmp_path / "train" / "r_1.png").unlink()
    (tmp_path / "train" / "r_3.png").unlink()
    messages = []
    scene = load_scene(tmp_path, log=messages.append)
    assert [c.name for c in scene.train] == ["train/r_0.png", "train/r_2.png", "train/r_4.png"]
    warnings = [m for m in messages if "skipped" in m]
    assert len(warnings) == 1 and "skipped 2 frame(s)" in warnings[0] and "transforms_train.json" in warnings[0]
    for i in (0, 2, 4):
        (tmp_path / "train" / f"r_{i}.png").unlink()
    with pytest.raises(InputError, match="none of the frames' images were found"):
        load_scene(tmp_path, log=messages.append)


def test_bad_transform_files(tmp_path):
    write_blender(tmp_path, [translation(0, 0, 4), translation(0, 0, 5)])
    path = tmp_path / "transforms_train.json"
    good = json.loads(path.read_text())

    path.write_text('{"camera_angle_x": 0.7, "frames": [')
    with pytest.raises(InputError, match=r"transforms_train.json: invalid JSON"):
        load_scene(tmp_path)

    def rewrite(change):
        data = json.loads(json.dumps(good))
        change(data)
        path.write_text(json.dumps(data))

    rewrite(lambda d: d.pop("camera_angle_x"))
    with pytest.raises(InputError, match="missing 'camera_angle_x'"):
        load_scene(tmp_path)
    rewrite(lambda d: d["frames"][1].pop("transform_matrix"))
    with pytest.raises(InputError, match=r"transforms_train.json: frame 1 .* missing 'transform_matrix'"):
        load_scene(tmp_path)
    rewrite(lambda d: d["frames"][1]["transform_matrix"][0].__setitem__(3, float("nan")))
    with pytest.raises(InputError, match="frame 1 .*NaN"):
        load_scene(tmp_path)
    rewrite(lambda d: d["frames"][0].__setitem__("transform_matrix", np.zeros((4, 4)).tolist()))
    with pytest.raises(InputError, match="frame 0 .*singular"):
        load_scene(tmp_path)
    rewrite(lambda d: d["frames"][0].__setitem__("transform_matrix", [[1, 0], [0, 1]]))
    with pytest.raises(InputError, match="frame 0 .*expected 4x4"):
        load_scene(tmp_path)
    rewrite(lambda d: d.pop("frames"))
    with pytest.raises(InputError, match="'frames'"):
        load_scene(tmp_path)


# --- instant-ngp / nerfstudio --------------------------------------------------------


def write_nerfstudio(root: Path, n=3, extra=None, frame_extra=None, width=40, height=30):
    rng = np.random.default_rng(0)
    frames = []
    for i in range(n):
        name = f"images/frame_{i + 1:05d}.png"
        (root / "images").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / name), rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8))
        frame = {"file_path": name, "transform_matrix": translation(0, 0, 3 + i).tolist()}
        frame.update((frame_extra or {}).get(i, {}))
        frames.append(frame)
    data = {"camera_model": "OPENCV", "fl_x": 50.0, "fl_y": 52.0, "cx": 19.0, "cy": 14.0, "w": width, "h": height,
            "k1": 0.0, "k2": 0.0, "p1": 0.0, "p2": 0.0, "frames": frames}
    data.update(extra or {})
    (root / "transforms.json").write_text(json.dumps(data))


def test_nerfstudio_per_frame_intrinsics_override_the_shared_ones(tmp_path):
    write_nerfstudio(tmp_path, frame_extra={1: {"fl_x": 60.0, "cx": 21.0}, 2: {"fl_y": 40.0, "cy": 16.5}})
    cameras = load_scene(tmp_path).train
    assert [c.name for c in cameras] == [f"images/frame_0000{i}.png" for i in (1, 2, 3)]
    assert np.allclose(cameras[0].K.numpy(), [[50, 0, 19], [0, 52, 14], [0, 0, 1]])
    assert np.allclose(cameras[1].K.numpy(), [[60, 0, 21], [0, 52, 14], [0, 0, 1]])
    assert np.allclose(cameras[2].K.numpy(), [[50, 0, 19], [0, 40, 16.5], [0, 0, 1]])
    # Same OpenGL -> OpenCV flip as Blender: the camera at z=3 looking down -z sees the origin in front.
    assert project(cameras[0], np.zeros(3))[2] == pytest.approx(3.0)


def test_nerfstudio_field_of_view_and_default_center(tmp_path):
    write_nerfstudio(tmp_path, n=1, width=40, height=30)
    data = json.loads((tmp_path / "transforms.json").read_text())
    for key in ("fl_x", "fl_y", "cx", "cy", "w", "h"):
        data.pop(key)
    data["camera_angle_x"] = ANGLE_X
    (tmp_path / "transforms.json").write_text(json.dumps(data))
    camera = load_scene(tmp_path).train[0]
    assert np.allclose(camera.K.numpy(), [[FOCAL, 0, 20], [0, FOCAL, 15], [0, 0, 1]], atol=1e-4)


def test_nerfstudio_distortion_is_undistorted(tmp_path):
    write_nerfstudio(tmp_path, n=1, extra={"k1": -0.2, "p1": 0.01})
    camera = load_scene(tmp_path).train[0]
    K = np.array([[50, 0, 19], [0, 52, 14], [0, 0, 1.0]])
    expected = make_undistortion(K, [-0.2, 0.0, 0.01, 0.0], (40, 30))
    assert np.allclose(camera.K.numpy(), expected.K, atol=1e-4)
    assert (camera.width, camera.height) == expected.size and camera.image.shape[:2] == (camera.height, camera.width)


def test_nerfstudio_images_n_masks_and_points(tmp_path):
    write_nerfstudio(tmp_path, n=2, frame_extra={1: {"mask_path": "m/second.png"}}, extra={"ply_file_path": "sparse_pc.ply"})
    (tmp_path / "images_2").mkdir()
    cv2.imwrite(str(tmp_path / "images_2" / "frame_00001.png"), np.full((15, 20, 3), 50, np.uint8))
    (tmp_path / "m").mkdir()
    mask = np.zeros((30, 40), np.uint8)
    mask[:, :10] = 255
    cv2.imwrite(str(tmp_path / "m" / "second.png"), mask)
    (tmp_path / "masks").mkdir()
    cv2.imwrite(str(tmp_path / "masks" / "frame_00001.png"), 255 - mask)  # found beside images/

    xyz = np.array([[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]])
    vertices = np.array([(*p, 255, 0, 51) for p in xyz],
                        dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"), ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    PlyData([PlyElement.describe(vertices, "vertex")]).write(str(tmp_path / "sparse_pc.ply"))

    scene = load_scene(tmp_path, resolution=2, cache_dir=tmp_path / "c")
    first, second = scene.train
    assert first.image_path.endswith("images_2/frame_00001.png") and np.allclose(first.image.numpy(), 50 / 255)
    assert np.allclose(first.K.numpy(), [[25, 0, 9.5], [0, 26, 7], [0, 0, 1]])
    assert first.mask.numpy()[:, :5].sum() == 0 and first.mask.numpy()[:, 5:].min() == 1
    assert second.mask.numpy()[:, :5].min() == 1 and second.mask.numpy()[:, 5:].sum() == 0
    assert np.allclose(scene.points, xyz) and np.allclose(scene.point_colors, [[1.0, 0.0, 0.2]] * 2)

    (tmp_path / "sparse_pc.ply").unlink()
    messages = []
    assert load_scene(tmp_path, log=messages.append).points is None
    assert any("sparse_pc.ply not found" in m for m in messages)


def test_nerfstudio_errors(tmp_path):
    write_nerfstudio(tmp_path, n=2, extra={"camera_model": "EQUIRECTANGULAR"})
    with pytest.raises(InputError, match="camera model EQUIRECTANGULAR is not supported"):
        load_scene(tmp_path)
    write_nerfstudio(tmp_path, n=2, extra={"fl_x": None})
    with pytest.raises(InputError, match=r"transforms.json: frame 0 .*no focal length"):
        load_scene(tmp_path)
    write_nerfstudio(tmp_path, n=2, frame_extra={1: {"fl_x": float("nan")}})
    with pytest.raises(InputError, match="frame 1 .*'fl_x' must be a finite number"):
        load_scene(tmp_path)
    write_nerfstudio(tmp_path, n=2, frame_extra={1: {"mask_path": "nope.png"}})
    with pytest.raises(InputError, match="mask .*nope.png not found"):
        load_scene(tmp_path)
    write_nerfstudio(tmp_path, n=2, frame_extra={1: {"file_path": "images/frame_00001.png"}})
    with pytest.raises(InputError, match="listed more than once"):
        load_scene(tmp_path)
