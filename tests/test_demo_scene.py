"""The embedded demo scene (scenes/demo) and its generator (scenes/make_demo.py).

The COLMAP text files are parsed here with a few lines of our own, not with the
project's readers, so a bug in a reader and a bug in the scene cannot hide each other.
"""

import importlib.util
import math
import os
import sys

import cv2
import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEMO = os.path.join(REPO, "scenes", "demo")
TEXT_FILES = ("cameras.txt", "images.txt", "points3D.txt")


def _load_generator():
    spec = importlib.util.spec_from_file_location(
        "make_demo", os.path.join(REPO, "scenes", "make_demo.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


# ---------------------------------------------------------------------------
# A tiny, independent COLMAP text parser
# ---------------------------------------------------------------------------


def _data_lines(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f if not line.startswith("#")]


def parse_cameras(path):
    cameras = {}
    for line in _data_lines(path):
        fields = line.split()
        cameras[int(fields[0])] = (fields[1], int(fields[2]), int(fields[3]),
                                   [float(x) for x in fields[4:]])
    return cameras


def parse_images(path):
    """[(image_id, qvec, tvec, camera_id, name, [(x, y, point3d_id)])], in file order."""
    lines = _data_lines(path)
    assert len(lines) % 2 == 0, "images.txt must hold two lines per image"
    images = []
    for pose_line, points_line in zip(lines[0::2], lines[1::2]):
        f = pose_line.split()
        values = points_line.split()
        points2d = [(float(values[i]), float(values[i + 1]), int(values[i + 2]))
                    for i in range(0, len(values), 3)]
        images.append((int(f[0]), np.array(f[1:5], float), np.array(f[5:8], float),
                       int(f[8]), f[9], points2d))
    return images


def parse_points(path):
    """{point_id: (xyz, rgb uint8, error, [(image_id, point2d_idx)])}."""
    points = {}
    for line in _data_lines(path):
        f = line.split()
        track = [(int(f[i]), int(f[i + 1])) for i in range(8, len(f), 2)]
        points[int(f[0])] = (np.array(f[1:4], float), np.array(f[4:7], int), float(f[7]), track)
    return points


def quat_to_matrix(q):
    """Rotation matrix of a unit quaternion (w, x, y, z): the textbook formula."""
    w, x, y, z = q / np.linalg.norm(q)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def read_rgb(path):
    bgr = cv2.imread(path, cv2.IMREAD_UNCHANGED)
    assert bgr is not None, f"cannot read {path}"
    return bgr[:, :, ::-1]


# ---------------------------------------------------------------------------
# The committed scene
# ---------------------------------------------------------------------------


def test_committed_scene_has_colmap_layout():
    sparse = os.path.join(DEMO, "sparse", "0")
    cameras = parse_cameras(os.path.join(sparse, "cameras.txt"))
    assert list(cameras) == [1]
    model, width, height, params = cameras[1]
    assert (model, width, height) == ("PINHOLE", 128, 96) and len(params) == 4

    images = parse_images(os.path.join(sparse, "images.txt"))
    names = [im[4] for im in images]
    assert 24 <= len(images) <= 40
    assert names == sorted(names) == [f"frame_{i:03d}.png" for i in range(len(images))]
    assert [im[0] for im in images] == list(range(1, len(images) + 1))
    for image_id, q, _, camera_id, name, _ in images:
        assert camera_id == 1 and abs(np.linalg.norm(q) - 1.0) < 1e-9
        assert read_rgb(os.path.join(DEMO, "images", name)).shape == (height, width, 3)

    points = parse_points(os.path.join(sparse, "points3D.txt"))
    assert 2000 <= len(points) <= 4000
    by_id = {im[0]: im for im in images}
    for point_id, (_, rgb, error, track) in points.items():
        assert len(track) >= 2 and np.all((0 <= rgb) & (rgb <= 255)) and error >= 0
        for image_id, point2d_idx in track:  # each track entry points back at this point
            assert by_id[image_id][5][point2d_idx][2] == point_id

    total = sum(os.path.getsize(os.path.join(root, f))
                for root, _, files in os.walk(DEMO) for f in files)
    assert total < 1_500_000


def _compare_text(committed, fresh):
    """Token by token: words and integers exactly, decimals to 1e-9 relative, so the
    check survives last-bit differences of another CPU's math library."""
    with open(committed) as a, open(fresh) as b:
        lines_a, lines_b = a.read().splitlines(), b.read().splitlines()
    assert len(lines_a) == len(lines_b), committed
    for number, (la, lb) in enumerate(zip(lines_a, lines_b)):
        ta, tb = la.split(), lb.split()
        assert len(ta) == len(tb), f"{committed}:{number + 1}"
        for x, y in zip(ta, tb):
            if x == y:
                continue
            assert math.isclose(float(x), float(y), rel_tol=1e-9, abs_tol=1e-9), \
                f"{committed}:{number + 1}: {x} != {y}"


def test_committed_scene_matches_regeneration(tmp_path):
    gen.make_demo(str(tmp_path))
    committed_names = sorted(os.listdir(os.path.join(DEMO, "images")))
    assert sorted(os.listdir(tmp_path / "images")) == committed_names
    for name in committed_names:
        a = read_rgb(os.path.join(DEMO, "images", name)).astype(int)
        b = read_rgb(str(tmp_path / "images" / name)).astype(int)
        assert a.shape == b.shape and np.abs(a - b).max() <= 1, name
        assert np.mean(a != b) < 1e-3, name
    for text in TEXT_FILES:
        _compare_text(os.path.join(DEMO, "sparse", "0", text),
                      str(tmp_path / "sparse" / "0" / text))


def _projection_agreement(invert_pose=False):
    """Project every track observation of every 3D point with the stored pose and K.

    Returns (share whose pixel colour matches the point colour, share that lands
    within 1.5 px of the stored keypoint). The colour may match in the pixel hit or one
    of its 8 neighbours: images are anti-aliased, so a point within a pixel of a texture
    edge sees a blend. `invert_pose` reads the stored pose the wrong way round, as
    camera-to-world (a classic mix-up), which must break both.
    """
    sparse = os.path.join(DEMO, "sparse", "0")
    _, width, height, (fx, fy, cx, cy) = parse_cameras(os.path.join(sparse, "cameras.txt"))[1]
    images = {im[0]: im for im in parse_images(os.path.join(sparse, "images.txt"))}
    pixels = {i: read_rgb(os.path.join(DEMO, "images", im[4])).astype(float) / 255.0
              for i, im in images.items()}
    color_ok, keypoint_ok, total = 0, 0, 0
    for xyz, rgb, _, track in parse_points(os.path.join(sparse, "points3D.txt")).values():
        for image_id, point2d_idx in track:
            _, q, t, _, _, points2d = images[image_id]
            R = quat_to_matrix(q)
            cam = R.T @ (xyz - t) if invert_pose else R @ xyz + t
            total += 1
            if cam[2] <= 0:
                continue
            u, v = fx * cam[0] / cam[2] + cx, fy * cam[1] / cam[2] + cy
            kx, ky, _ = points2d[point2d_idx]
            keypoint_ok += math.hypot(u - kx, v - ky) < 1.5
            if 0 <= u < width and 0 <= v < height:
                col, row = int(u), int(v)  # pixel centres sit at (i + 0.5, j + 0.5)
                window = pixels[image_id][max(row - 1, 0):row + 2, max(col - 1, 0):col + 2]
                difference = np.abs(window - rgb / 255.0).max(axis=-1)
                color_ok += difference.min() < 0.08
    return color_ok / total, keypoint_ok / total


def test_points_project_onto_their_colour_with_the_colmap_convention():
    color_share, keypoint_share = _projection_agreement()
    assert color_share > 0.97
    assert keypoint_share > 0.99
    wrong_color, wrong_keypoint = _projection_agreement(invert_pose=True)
    assert wrong_color < 0.3 and wrong_keypoint < 0.05


# ---------------------------------------------------------------------------
# The generator's ray caster, shading and camera maths on trivial setups
# ---------------------------------------------------------------------------


def _ray(origin, direction):
    d = np.array([direction], float)
    return np.array([origin], float), d / np.linalg.norm(d)


def _unit_sphere(center=(0.0, 0.0, 0.0), radius=1.0):
    return gen.Sphere(center=center, radius=radius, color_a=(1, 0, 0), color_b=(0, 0, 1),
                      pattern="checker", frequency=4)


def test_sphere_hit_distances_and_normal():
    sphere = _unit_sphere()
    o, d = _ray((0, 0, -5), (0, 0, 1))
    assert sphere.intersect(o, d)[0] == pytest.approx(4.0)
    assert np.allclose(sphere.normal(o + 4.0 * d), [[0, 0, -1]])
    o, d = _ray((0, 0, 0), (0.6, 0.8, 0))  # from inside: the exit point
    assert sphere.intersect(o, d)[0] == pytest.approx(1.0)
    o, d = _ray((0.6, 0, -5), (0, 0, 1))  # off-centre chord: 5 - sqrt(1 - 0.36)
    assert sphere.intersect(o, d)[0] == pytest.approx(5.0 - 0.8)
    for origin, direction in [((1.5, 0, -5), (0, 0, 1)), ((0, 0, 5), (0, 0, 1))]:
        o, d = _ray(origin, direction)  # passes beside it / points away from it
        assert np.isinf(sphere.intersect(o, d)[0])


def test_box_and_ground_hit_distances():
    box = gen.Box(center=(0, 0, 0), half_size=(1, 1, 1), yaw=0.0, color=(1, 1, 1),
                  line_color=(0, 0, 0), grid=1.0)
    o, d = _ray((-5, 0.2, 0.3), (1, 0, 0))
    assert box.intersect(o, d)[0] == pytest.approx(4.0)
    assert np.allclose(box.normal(o + 4.0 * d), [[-1, 0, 0]])
    o, d = _ray((-5, 1.5, 0), (1, 0, 0))
    assert np.isinf(box.intersect(o, d)[0])
    turned = gen.Box(center=(0, 0, 0), half_size=(1, 1, 1), yaw=math.pi / 4, color=(1, 1, 1),
                     line_color=(0, 0, 0), grid=1.0)
    o, d = _ray((-5, 0, 0), (1, 0, 0))  # a 45-degree turn puts an edge at x = -sqrt(2)
    assert turned.intersect(o, d)[0] == pytest.approx(5.0 - math.sqrt(2.0))

    ground = gen.GroundDisc(radius=3.0, tile=1.0, color_a=(0, 0, 0), color_b=(1, 1, 1),
                            fade_start=2.0)
    o, d = _ray((0, 0, 2), (1, 0, -1))
    assert ground.intersect(o, d)[0] == pytest.approx(2.0 * math.sqrt(2.0))
    o, d = _ray((0, 0, 2), (2, 0, -1))  # lands at x = 4, outside the disc
    assert np.isinf(ground.intersect(o, d)[0])


def test_cast_takes_the_nearest_hit_and_shading_follows_lambert_and_shadows():
    near, far = _unit_sphere((0, 0, 3), 0.5), _unit_sphere((0, 0, 6), 1.0)
    o, d = _ray((0, 0, 0), (0, 0, 1))
    t, ids = gen.cast([far, near], o, d)
    assert t[0] == pytest.approx(2.5) and ids[0] == 1
    t, ids = gen.cast([far, near], *_ray((0, 0, 0), (0, 1, 0)))
    assert np.isinf(t[0]) and ids[0] == -1

    grey = (0.5, 0.5, 0.5)
    ground = gen.GroundDisc(radius=10.0, tile=1.0, color_a=grey, color_b=grey, fade_start=5.0)
    blocker = _unit_sphere(tuple(2.0 * gen.LIGHT_DIR), 0.5)  # sits between (0,0,0) and the light
    points = np.array([[0.0, 0.0, 0.0], [6.0, 6.0, 0.0]])
    colors = gen.surface_color([ground, blocker], points, np.array([0, 0]))
    assert np.allclose(colors[0], 0.5 * gen.AMBIENT)  # in the sphere's shadow
    lit = 0.5 * (gen.AMBIENT + (1 - gen.AMBIENT) * gen.LIGHT_DIR[2])  # n = +z
    assert np.allclose(colors[1], lit)


def test_look_at_uses_opencv_axes_and_quaternion_round_trips():
    w2c = gen.look_at(np.array([5.0, 0.0, 0.0]), np.zeros(3))
    assert np.allclose(w2c[:3, :3] @ np.zeros(3) + w2c[:3, 3], [0, 0, 5])  # target ahead
    assert np.allclose(w2c[:3, :3] @ [0, 0, 1], [0, -1, 0])  # world up is image up (-y)
    assert np.allclose(w2c[:3, :3] @ [0, 1, 0], [1, 0, 0])  # looking along -x: +y is right

    rng = np.random.default_rng(0)
    for _ in range(50):  # random rotations reach every branch of the conversion
        q = rng.normal(size=4)
        R = quat_to_matrix(q)
        assert np.allclose(quat_to_matrix(gen.rotation_to_quaternion(R)), R, atol=1e-12)
    for R in (np.diag([1.0, -1, -1]), np.diag([-1.0, 1, -1]), np.diag([-1.0, -1, 1])):
        assert np.allclose(quat_to_matrix(gen.rotation_to_quaternion(R)), R)  # 180-degree turns


def test_render_centre_pixel_sees_the_object_in_front():
    """A sphere straight ahead fills the centre pixel with its lit colour; a pixel that
    misses shows the sky for its ray."""
    sphere = gen.Sphere(center=(0.0, 0.0, 0.0), radius=1.0, color_a=(0.2, 0.4, 0.6),
                        color_b=(0.2, 0.4, 0.6), pattern="stripes", frequency=1.0)
    eye = 4.0 * gen.LIGHT_DIR  # the light comes from behind the camera: n . l = 1 at the centre
    w2c = gen.look_at(eye, np.zeros(3))
    image = gen.render([sphere], w2c, gen.intrinsics())
    centre = image[gen.HEIGHT // 2, gen.WIDTH // 2]
    assert np.allclose(centre, [0.2, 0.4, 0.6], atol=0.01)
    corner = image[0, 0]
    o, d = gen.pixel_rays(w2c, gen.intrinsics(), np.array([0.5]), np.array([0.5]))
    assert np.allclose(corner, gen.sky_color(d)[0], atol=0.01)
