"""The `turbogs` command line end to end: a real (tiny) training run into INRIA's layout,
eval / render / export on its output, resume, and one-line errors with exit code 2."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from colmap_writer import write_model

from turbogs.cli import main
from turbogs.data import colmap
from turbogs.formats.ply import read_ply

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "scenes" / "demo"


def small_demo(root: Path, views: int = 10, binary: bool = False) -> Path:
    """The first `views` views of the demo capture, as a COLMAP text or binary model."""
    scene = root / "scene"
    (scene / "images").mkdir(parents=True)
    model = colmap.read_model(DEMO / "sparse" / "0")
    images = sorted(model.images, key=lambda im: im.name)[:views]
    for im in images:
        shutil.copy(DEMO / "images" / im.name, scene / "images" / im.name)
    write_model(scene / "sparse" / "0", list(model.cameras.values()), images, model.points, model.colors,
                       binary=binary)
    return scene


def run_cli(args, capsys):
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One 3dgs and one turbo run of 40 steps on 10 demo views (2 of them test views)."""
    root = tmp_path_factory.mktemp("cli")
    scene = small_demo(root)
    outs = {}
    for preset in ("3dgs", "turbo"):
        out = root / f"model_{preset}"
        code = main(["train", str(scene), "--out", str(out), "--preset", preset, "--steps", "40", "--eval",
                     "--quiet", "--seed", "3"])
        assert code == 0
        outs[preset] = out
    return scene, outs


@pytest.mark.parametrize("preset", ["3dgs", "turbo"])
def test_train_writes_the_inria_layout(trained, preset):
    scene, outs = trained
    out = outs[preset]
    for name in ("cfg_args", "cameras.json", "input.ply", "results.json", "per_view.json",
                 "point_cloud/iteration_40/point_cloud.ply"):
        assert (out / name).is_file(), name
    results = json.loads((out / "results.json").read_text())
    assert {"psnr", "ssim", "num_gaussians", "train_seconds", "steps"} <= set(results)
    assert results["steps"] == 40 and results["preset"] == preset
    params, degree = read_ply(out / "point_cloud/iteration_40/point_cloud.ply")
    assert len(params["means"]) == results["num_gaussians"] and degree == 3
    cameras = json.loads((out / "cameras.json").read_text())
    assert len(cameras) == 10 and {"id", "img_name", "width", "height", "position", "rotation", "fx", "fy"} <= set(cameras[0])
    # Every 8th view in name order is held out: frame_000 and frame_008.
    assert sorted(json.loads((out / "per_view.json").read_text())) == ["frame_000.png", "frame_008.png"]
    assert (out / "test/ours_40/renders/frame_000.png").is_file() and (out / "test/ours_40/gt/frame_008.png").is_file()
    assert "source_path=" in (out / "cfg_args").read_text()


def test_seeded_cpu_runs_are_reproducible(trained, tmp_path):
    scene, outs = trained
    again = tmp_path / "again"
    assert main(["train", str(scene), "--out", str(again), "--preset", "3dgs", "--steps", "40", "--quiet", "--seed", "3", "--eval"]) == 0
    first, _ = read_ply(outs["3dgs"] / "point_cloud/iteration_40/point_cloud.ply")
    second, _ = read_ply(again / "point_cloud/iteration_40/point_cloud.ply")
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])


def test_eval_render_export(trained, tmp_path, capsys):
    scene, outs = trained
    out = outs["3dgs"]
    before = json.loads((out / "results.json").read_text())
    code, stdout, _ = run_cli(["eval", out], capsys)
    assert code == 0 and "PSNR" in stdout
    after = json.loads((out / "results.json").read_text())
    assert after["psnr"] == pytest.approx(before["psnr"], abs=1e-4)

    code, _, _ = run_cli(["render", out, "--split", "train", "--out", tmp_path / "renders"], capsys)
    assert code == 0
    pngs = sorted((tmp_path / "renders").glob("*.png"))
    assert len(pngs) == 8 and cv2.imread(str(pngs[0])).shape == (96, 128, 3)

    code, _, _ = run_cli(["export", out, "--format", "splat", "-o", tmp_path / "m.splat"], capsys)
    assert code == 0
    assert (tmp_path / "m.splat").stat().st_size == 32 * before["num_gaussians"]
    code, _, _ = run_cli(["export", out, "--format", "ply", "-o", tmp_path / "m.ply"], capsys)
    assert code == 0 and len(read_ply(tmp_path / "m.ply")[0]["means"]) == before["num_gaussians"]


def test_finished_model_is_not_overwritten_and_resume_continues(trained, tmp_path, capsys):
    scene, outs = trained
    out = tmp_path / "model"
    shutil.copytree(outs["3dgs"], out)
    code, _, err = run_cli(["train", scene, "--out", out, "--preset", "3dgs", "--steps", "60", "--quiet"], capsys)
    assert code == 2 and "already holds a trained model" in err and len(err.strip().splitlines()) == 1
    code, stdout, _ = run_cli(["train", scene, "--out", out, "--preset", "3dgs", "--steps", "60", "--quiet",
                               "--resume", "--eval", "--seed", "3"], capsys)
    assert code == 0 and "resuming from step 40" in stdout
    assert json.loads((out / "results.json").read_text())["steps"] == 60
    assert (out / "point_cloud/iteration_60/point_cloud.ply").is_file()


def corrupt(scene: Path, how: str) -> None:
    if how == "unknown camera model":
        text = (scene / "sparse/0/cameras.txt").read_text().replace("PINHOLE", "FISHEYE_UNHEARD_OF")
        (scene / "sparse/0/cameras.txt").write_text(text)
    elif how == "corrupt image":
        (scene / "images/frame_003.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    elif how == "image size":
        image = cv2.imread(str(scene / "images/frame_003.png"))
        cv2.imwrite(str(scene / "images/frame_003.png"), cv2.resize(image, (100, 80)))
    elif how == "NaN pose":
        lines = (scene / "sparse/0/images.txt").read_text().splitlines()
        first = next(i for i, line in enumerate(lines) if line and not line.startswith("#"))
        fields = lines[first].split()
        fields[5] = "nan"
        lines[first] = " ".join(fields)
        (scene / "sparse/0/images.txt").write_text("\n".join(lines) + "\n")
    elif how == "no images":
        shutil.rmtree(scene / "images")
        (scene / "images").mkdir()


@pytest.mark.parametrize("how, expected", [
    ("unknown camera model", "FISHEYE_UNHEARD_OF"),
    ("corrupt image", "frame_003.png"),
    ("image size", "frame_003.png"),
    ("NaN pose", "frame_000.png"),
    ("no images", "frame_"),
])
def test_bad_scene_gives_one_line_and_exit_2(tmp_path, capsys, how, expected):
    scene = small_demo(tmp_path, views=4)
    corrupt(scene, how)
    code, _, err = run_cli(["train", scene, "--out", tmp_path / "out", "--steps", "2", "--quiet"], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and "Traceback" not in err


def test_truncated_bin_and_missing_folder(tmp_path, capsys):
    scene = small_demo(tmp_path, views=4, binary=True)
    data = (scene / "sparse/0/images.bin").read_bytes()
    (scene / "sparse/0/images.bin").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli(["train", scene, "--out", tmp_path / "out", "--steps", "2", "--quiet"], capsys)
    assert code == 2 and "images.bin" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(["train", tmp_path / "nowhere", "--out", tmp_path / "out2", "--quiet"], capsys)
    assert code == 2 and "nowhere" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, expected", [
    (["-r", "3"], "downscale factor"),
    (["--budget-seconds", "-5"], "positive"),
    (["--steps", "0"], "positive"),
])
def test_bad_flags_exit_2_with_one_line(tmp_path, flags, expected):
    """argparse's own errors: usage plus one 'error:' line, exit 2, no traceback."""
    done = subprocess.run([sys.executable, "-m", "turbogs", "train", str(DEMO), *flags],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and expected in done.stderr and "Traceback" not in done.stderr


def test_output_path_that_is_a_file(tmp_path, capsys):
    target = tmp_path / "a_file"
    target.write_text("x")
    code, _, err = run_cli(["train", DEMO, "--out", target, "--steps", "2", "--quiet"], capsys)
    assert code == 2 and "is a file" in err
