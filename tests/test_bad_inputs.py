"""The bad-input corpus: every broken capture, model file or flag a user can plausibly
hand to `turbogs` ends in one stderr line that names the file and the problem, exit
code 2 and no traceback; and the odd-but-valid inputs (grayscale, 16-bit, RGBA) train.

Each case builds its input from the demo capture in tmp_path, breaks one thing, and
runs the real CLI (`turbogs.cli.main`). Failures happen while loading, before training.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from colmap_writer import write_model
from test_cli import DEMO, small_demo

from turbogs.cli import main
from turbogs.data import colmap
from turbogs.data.load import load_scene
from turbogs.data.transforms import GL_TO_CV
from turbogs.formats.ply import write_ply

VIEWS = 4


# --- building inputs -------------------------------------------------------------------


def binary_scene(tmp: Path) -> Path:
    return small_demo(tmp, views=VIEWS, binary=True)


def text_scene(tmp: Path) -> Path:
    return small_demo(tmp, views=VIEWS, binary=False)


def model_parts(views: int = VIEWS):
    model = colmap.read_model(DEMO / "sparse" / "0")
    images = sorted(model.images, key=lambda im: im.name)[:views]
    return model, list(model.cameras.values()), images


def rewrite_model(scene: Path, cameras, images, binary: bool) -> None:
    model = colmap.read_model(DEMO / "sparse" / "0")
    folder = scene / "sparse" / "0"
    for f in folder.iterdir():
        f.unlink()
    write_model(folder, cameras, images, model.points, model.colors, binary=binary)


def with_camera(scene: Path, binary: bool, **changes) -> None:
    _, cameras, images = model_parts()
    camera = cameras[0]
    for key, value in changes.items():
        setattr(camera, key, value)
    rewrite_model(scene, cameras, images, binary)


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def set_count(path: Path, delta: int) -> None:
    data = path.read_bytes()
    (count,) = struct.unpack_from("<Q", data)
    path.write_bytes(struct.pack("<Q", count + delta) + data[8:])


def nerfstudio_scene(tmp: Path, frames_edit=None) -> Path:
    """The demo's first views as an instant-ngp/nerfstudio transforms.json capture."""
    scene = tmp / "ns"
    (scene / "images").mkdir(parents=True)
    _, cameras, images = model_parts()
    camera = cameras[0]
    frames = []
    for im in images:
        shutil.copy(DEMO / "images" / im.name, scene / "images" / im.name)
        cam_to_world_gl = np.linalg.inv(colmap.world_to_cam(im)) @ GL_TO_CV
        frames.append({"file_path": f"images/{im.name}", "transform_matrix": cam_to_world_gl.tolist()})
    fx, fy, cx, cy = camera.params
    data = {"fl_x": fx, "fl_y": fy, "cx": cx, "cy": cy, "w": camera.width, "h": camera.height, "frames": frames}
    if frames_edit is not None:
        frames_edit(data)
    (scene / "transforms.json").write_text(json.dumps(data))
    return scene


def first_image(scene: Path) -> Path:
    return sorted((scene / "images").iterdir())[0]


def demo_ply(tmp: Path) -> Path:
    """A valid 5-Gaussian INRIA .ply (SH degree 1)."""
    rng = np.random.default_rng(0)
    n = 5
    params = {"means": rng.normal(size=(n, 3)), "scales": rng.normal(size=(n, 3)), "quats": rng.normal(size=(n, 4)),
              "opacities": rng.normal(size=n), "sh0": rng.normal(size=(n, 1, 3)), "shN": rng.normal(size=(n, 3, 3))}
    path = tmp / "model.ply"
    write_ply(path, params)
    return path


def header_and_body(path: Path):
    data = path.read_bytes()
    end = data.index(b"end_header\n") + len(b"end_header\n")
    return data[:end].decode("ascii"), data[end:]


# --- the cases ---------------------------------------------------------------------------
# Each builder returns (argv after the command "train"/"export", the file the message must name).


def train_args(scene: Path, tmp: Path):
    return ["train", scene, "--out", tmp / "out", "--steps", "2", "--quiet", "--device", "cpu"]


def case_colmap(binary: bool, how: str):
    def build(tmp: Path):
        scene = binary_scene(tmp) if binary else text_scene(tmp)
        ext = ".bin" if binary else ".txt"
        folder = scene / "sparse" / "0"
        named = {"cameras": folder / f"cameras{ext}", "images": folder / f"images{ext}",
                 "points": folder / f"points3D{ext}"}
        if how.startswith("truncated "):
            target = named[how.split()[1]]
            truncate(target, 0.6)
            return train_args(scene, tmp), target.name
        if how == "cameras count +1":
            set_count(named["cameras"], +1)
            return train_args(scene, tmp), "cameras.bin"
        if how == "images count -1":
            set_count(named["images"], -1)
            return train_args(scene, tmp), "images.bin"
        if how == "points count +5":
            set_count(named["points"], +5)
            return train_args(scene, tmp), "points3D.bin"
        if how == "unknown model":
            if binary:
                data = bytearray(named["cameras"].read_bytes())
                struct.pack_into("<i", data, 8 + 4, 99)  # the first camera's model id
                named["cameras"].write_bytes(bytes(data))
            else:
                named["cameras"].write_text(named["cameras"].read_text().replace("PINHOLE", "NOT_A_MODEL"))
            return train_args(scene, tmp), named["cameras"].name
        if how == "unsupported model":
            with_camera(scene, binary, model="THIN_PRISM_FISHEYE", params=np.array([115.0, 115, 64, 48] + [0] * 8))
            return train_args(scene, tmp), named["cameras"].name
        if how == "image missing":
            first_image(scene).unlink()
            return train_args(scene, tmp), "frame_000.png"
        if how == "duplicate names":
            _, cameras, images = model_parts()
            images[1].name = images[0].name
            rewrite_model(scene, cameras, images, binary)
            return train_args(scene, tmp), named["images"].name
        if how == "zero width":
            with_camera(scene, binary, width=0)
            return train_args(scene, tmp), named["cameras"].name
        if how == "NaN focal":
            with_camera(scene, binary, params=np.array([np.nan, 115.0, 64.0, 48.0]))
            return train_args(scene, tmp), named["cameras"].name
        if how == "zero focal":
            with_camera(scene, binary, params=np.array([0.0, 0.0, 64.0, 48.0]))
            return train_args(scene, tmp), named["cameras"].name
        if how == "wrong parameter count":
            text = named["cameras"].read_text().splitlines()
            text[-1] += " 0.5"
            named["cameras"].write_text("\n".join(text) + "\n")
            return train_args(scene, tmp), "cameras.txt"
        if how == "garbage line":
            named["images"].write_text(named["images"].read_text() + "this is not an image line\n\n")
            return train_args(scene, tmp), "images.txt"
        raise AssertionError(how)

    return build


def case_transforms(how: str):
    def build(tmp: Path):
        if how == "invalid JSON":
            scene = nerfstudio_scene(tmp)
            path = scene / "transforms.json"
            path.write_text(path.read_text()[:-20])
        elif how == "no frames":
            scene = nerfstudio_scene(tmp, lambda d: d.pop("frames"))
        elif how == "frame without transform_matrix":
            scene = nerfstudio_scene(tmp, lambda d: d["frames"][1].pop("transform_matrix"))
        elif how == "NaN matrix":
            def edit(d):
                d["frames"][0]["transform_matrix"][0][3] = float("nan")
            scene = nerfstudio_scene(tmp, edit)
        elif how == "singular matrix":
            def edit(d):
                d["frames"][0]["transform_matrix"][0][:3] = [0.0, 0.0, 0.0]
            scene = nerfstudio_scene(tmp, edit)
        elif how == "no readable images":
            def edit(d):
                for f in d["frames"]:
                    f["file_path"] = "images/nowhere_" + f["file_path"][7:]
            scene = nerfstudio_scene(tmp, edit)
        elif how == "no focal length":
            scene = nerfstudio_scene(tmp, lambda d: (d.pop("fl_x"), d.pop("fl_y")))
        elif how == "negative aabb_scale":
            scene = nerfstudio_scene(tmp, lambda d: d.update(aabb_scale=-4))
        elif how == "offset of two numbers":
            scene = nerfstudio_scene(tmp, lambda d: d.update(offset=[0.5, 0.5]))
        elif how == "nerf-synthetic without camera_angle_x":
            scene = nerfstudio_scene(tmp)
            (scene / "transforms.json").rename(scene / "transforms_train.json")
            return train_args(scene, tmp), "transforms_train.json"
        else:
            raise AssertionError(how)
        return train_args(scene, tmp), "transforms.json"

    return build


def case_image(how: str):
    def build(tmp: Path):
        scene = binary_scene(tmp)
        image = first_image(scene)
        if how == "corrupt image":
            image.write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(64))
        elif how == "empty image file":
            image.write_bytes(b"")
        elif how == "image size disagrees":
            cv2.imwrite(str(image), cv2.resize(cv2.imread(str(image)), (100, 80)))
        elif how == "mask wrong size":
            (scene / "masks").mkdir()
            cv2.imwrite(str(scene / "masks" / image.name), np.full((50, 60), 255, np.uint8))
            return train_args(scene, tmp), f"masks/{image.name}"
        elif how == "corrupt mask":
            (scene / "masks").mkdir()
            (scene / "masks" / image.name).write_bytes(b"not a png")
            return train_args(scene, tmp), f"masks/{image.name}"
        else:
            raise AssertionError(how)
        return train_args(scene, tmp), image.name

    return build


def case_ply(how: str):
    def build(tmp: Path):
        path = demo_ply(tmp)
        header, body = header_and_body(path)
        if how == "not a ply":
            path.write_bytes(b"plx\n" + path.read_bytes()[4:])
        elif how == "ascii format":
            path.write_bytes(header.replace("binary_little_endian", "ascii").encode() + body)
        elif how == "missing fields":
            names = [line.split()[-1] for line in header.splitlines() if line.startswith("property")]
            values = np.frombuffer(body, dtype="<f4").reshape(5, len(names))
            kept = np.delete(values, names.index("opacity"), axis=1)
            lines = [line for line in header.splitlines() if line != "property float opacity"]
            path.write_bytes(("\n".join(lines) + "\n").encode() + kept.tobytes())
        elif how == "vertex count too large":
            path.write_bytes(header.replace("element vertex 5", "element vertex 5000").encode() + body)
        elif how == "NaN values":
            values = np.frombuffer(body, dtype="<f4").reshape(5, -1).copy()
            values[3, 1] = np.nan  # y of the fourth Gaussian
            path.write_bytes(header.encode() + values.tobytes())
        elif how == "no end_header":
            path.write_bytes(header.replace("end_header", "end_headr").encode() + body)
        elif how == "missing file":
            path.unlink()
        else:
            raise AssertionError(how)
        return ["export", path, "-o", tmp / "x.ply"], path.name

    return build


def case_cli(how: str):
    def build(tmp: Path):
        if how == "output path is a file":
            scene = binary_scene(tmp)
            target = tmp / "a_file"
            target.write_text("x")
            return ["train", scene, "--out", target, "--steps", "2", "--quiet"], "a_file"
        if how == "output below a file":
            scene = binary_scene(tmp)
            (tmp / "a_file").write_text("x")
            return ["train", scene, "--out", tmp / "a_file" / "model", "--steps", "2", "--quiet"], "a_file"
        if how == "scene folder missing":
            return ["train", tmp / "nowhere", "--out", tmp / "out", "--quiet"], "nowhere"
        if how == "scene is a file":
            (tmp / "scene.txt").write_text("x")
            return ["train", tmp / "scene.txt", "--out", tmp / "out", "--quiet"], "scene.txt"
        if how == "empty scene folder":
            (tmp / "empty").mkdir()
            return ["train", tmp / "empty", "--out", tmp / "out", "--quiet"], "empty"
        if how == "export into a missing folder":
            return ["export", demo_ply(tmp), "-o", tmp / "no_dir" / "x.ply"], "no_dir"
        raise AssertionError(how)

    return build


CASES = {
    **{f"colmap bin: {how}": case_colmap(True, how) for how in (
        "truncated cameras", "truncated images", "truncated points", "cameras count +1", "images count -1",
        "points count +5", "unknown model", "unsupported model", "image missing", "duplicate names", "zero width",
        "NaN focal", "zero focal")},
    **{f"colmap txt: {how}": case_colmap(False, how) for how in (
        "truncated cameras", "truncated points", "unknown model", "image missing", "duplicate names",
        "zero width", "NaN focal", "wrong parameter count", "garbage line")},
    **{f"transforms: {how}": case_transforms(how) for how in (
        "invalid JSON", "no frames", "frame without transform_matrix", "NaN matrix", "singular matrix",
        "no readable images", "no focal length", "negative aabb_scale", "offset of two numbers",
        "nerf-synthetic without camera_angle_x")},
    **{f"image: {how}": case_image(how) for how in (
        "corrupt image", "empty image file", "image size disagrees", "mask wrong size", "corrupt mask")},
    **{f"ply: {how}": case_ply(how) for how in (
        "not a ply", "ascii format", "missing fields", "vertex count too large", "NaN values", "no end_header",
        "missing file")},
    **{f"cli: {how}": case_cli(how) for how in (
        "output path is a file", "output below a file", "scene folder missing", "scene is a file",
        "empty scene folder", "export into a missing folder")},
}


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_line_error(code: int, err: str, names: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1, err
    assert names in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_exit_2(case, tmp_path, capsys):
    args, names = CASES[case](tmp_path)
    code, _, err = run_cli(args, capsys)
    assert_one_line_error(code, err, names)


def test_corpus_is_large_enough():
    assert len(CASES) >= 30


# --- the message says what is wrong, not only where ---------------------------------------


@pytest.mark.parametrize("case, words", [
    ("colmap bin: truncated images", "truncated or corrupt"),
    ("colmap bin: cameras count +1", "camera header"),
    ("colmap bin: images count -1", "left over"),
    ("colmap bin: unknown model", "unknown camera model"),
    ("colmap bin: duplicate names", "more than once"),
    ("colmap txt: NaN focal", "NaN"),
    ("transforms: singular matrix", "singular"),
    ("transforms: no readable images", "none of the frames"),
    ("image: image size disagrees", "camera says"),
    ("ply: vertex count too large", "claims 5000 vertices"),
    ("ply: NaN values", "'y'"),
    ("ply: missing fields", "opacity"),
])
def test_messages_name_the_problem(case, words, tmp_path, capsys):
    args, names = CASES[case](tmp_path)
    code, _, err = run_cli(args, capsys)
    assert words in assert_one_line_error(code, err, names)


# --- flags rejected by argparse: usage + one error line, exit 2 -----------------------------


@pytest.mark.parametrize("flags, expected", [
    (["--budget-seconds", "-5"], "must be a positive number"),
    (["-r", "3"], "neither a downscale factor"),
    (["--steps", "-1"], "must be positive"),
])
def test_bad_flags(flags, expected, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", str(DEMO), *flags])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and expected in errors[0]


def test_bad_flag_in_a_subprocess(tmp_path):
    done = subprocess.run([sys.executable, "-m", "turbogs", "train", str(DEMO), "-r", "3"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and "-r/--resolution" in done.stderr


def test_corrupt_colmap_in_a_subprocess(tmp_path):
    """The real entry point: nothing but the one line reaches stderr (no OpenCV or torch noise)."""
    args, names = CASES["colmap bin: truncated cameras"](tmp_path)
    done = subprocess.run([sys.executable, "-m", "turbogs", *map(str, args)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert_one_line_error(done.returncode, done.stderr, names)


def test_corrupt_image_in_a_subprocess(tmp_path):
    args, names = CASES["image: corrupt image"](tmp_path)
    done = subprocess.run([sys.executable, "-m", "turbogs", *map(str, args)], capture_output=True, text=True,
                          cwd=tmp_path)
    assert_one_line_error(done.returncode, done.stderr, names)


def test_read_only_output_folder(tmp_path, capsys, monkeypatch):
    """A folder without write permission. Root ignores mode bits, so where the tests run as
    root the write probe is made to fail as the kernel would for a normal user."""
    scene = binary_scene(tmp_path)
    out = tmp_path / "locked"
    out.mkdir()
    out.chmod(0o555)
    if os.geteuid() == 0:
        real_write_bytes = Path.write_bytes

        def write_bytes(self, data):
            if self.parent == out:
                raise PermissionError(13, "Permission denied", str(self))
            return real_write_bytes(self, data)

        monkeypatch.setattr(Path, "write_bytes", write_bytes)
    try:
        code, _, err = run_cli(["train", scene, "--out", out, "--steps", "2", "--quiet"], capsys)
    finally:
        out.chmod(0o755)
    line = assert_one_line_error(code, err, "locked")
    assert "not writable" in line


# --- odd but valid images train -------------------------------------------------------------


def rewrite_images(scene: Path, convert) -> None:
    for image in sorted((scene / "images").iterdir()):
        bgr = cv2.imread(str(image))
        cv2.imwrite(str(image), convert(bgr))


def alpha_channel(bgr):
    alpha = np.full(bgr.shape[:2], 255, np.uint8)
    alpha[:, :16] = 0  # a transparent left strip
    return np.dstack([bgr, alpha])


@pytest.mark.parametrize("kind, convert", [
    ("grayscale", lambda bgr: cv2.cvtColor(bgr, cv2.COLOR_BGR2GRAY)),
    ("16-bit", lambda bgr: bgr.astype(np.uint16) * 257),
    ("RGBA", alpha_channel),
])
def test_odd_images_train(kind, convert, tmp_path, capsys):
    scene = binary_scene(tmp_path)
    rewrite_images(scene, convert)
    code, out, err = run_cli(train_args(scene, tmp_path), capsys)
    assert code == 0, err
    assert "done: 2 steps" in out
    assert (tmp_path / "out" / "point_cloud" / "iteration_2" / "point_cloud.ply").is_file()


def test_rgba_alpha_becomes_the_mask_and_16_bit_keeps_precision(tmp_path):
    scene = binary_scene(tmp_path)
    rewrite_images(scene, alpha_channel)
    camera = load_scene(scene, log=lambda _: None).train[0]
    assert camera.mask is not None
    assert camera.mask[:, :16].sum() == 0 and camera.mask[:, 16:].min() == 1

    image = first_image(scene)
    deep = np.zeros((96, 128, 3), np.uint16)
    deep[..., 1] = 1000  # below one 8-bit step (257): lost if the loader dropped to 8 bits
    cv2.imwrite(str(image), deep)
    camera = next(c for c in load_scene(scene, log=lambda _: None).train if c.name == image.name)
    np.testing.assert_allclose(camera.image[..., 1].numpy(), 1000 / 65535, rtol=1e-5)
    assert float(camera.image[..., 0].max()) == 0.0
