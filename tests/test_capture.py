"""From a folder of photos or a video to a trained model (turbogs/capture/): `turbogs sfm` finds the
cameras of photos rendered by scenes/'s independent ray caster, which are compared with the true
poses the renderer used (up to the similarity SfM cannot know); `turbogs train PHOTOS/` and
`turbogs train clip.mp4` run end to end; bad inputs are one line and exit 2."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import cv2
import numpy as np
import pytest
from conftest import REPO

from turbogs.capture import frames as video_frames
from turbogs.capture.photos import PhotoFolder, camera_mode, find_photos
from turbogs.capture.summary import SfmSummary
from turbogs.cli import main
from turbogs.data import colmap
from turbogs.errors import InputError

pytest.importorskip("pycolmap", reason='pycolmap is in the capture extra: pip install -e ".[capture]"')
imageio_ffmpeg = pytest.importorskip("imageio_ffmpeg", reason='the capture extra: pip install -e ".[capture]"')

_spec = importlib.util.spec_from_file_location("make_captures", REPO / "scenes" / "make_captures.py")
captures = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("make_captures", captures)
_spec.loader.exec_module(captures)


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    captures.make_capture("photos", str(root))
    return root / "photos", json.loads((root / "photos_poses.json").read_text())


def similarity(source, target):
    """Umeyama: scale, rotation, translation with target ~ s R source + t (least squares)."""
    mu_s, mu_t = source.mean(0), target.mean(0)
    a, b = source - mu_s, target - mu_t
    u, d, vt = np.linalg.svd(b.T @ a / len(a))
    fix = np.diag([1, 1, np.sign(np.linalg.det(u @ vt))])
    rotation = u @ fix @ vt
    scale = np.trace(np.diag(d) @ fix) / (a**2).sum(1).mean()
    return scale, rotation, mu_t - scale * rotation @ mu_s


def assert_the_renderers_cameras(model, truth):
    """SfM's cameras are the renderer's up to a similarity: the centres within 2% of the orbit's radius,
    the viewing axes within 3 pixels at the image centre (1.0 degree for the pinhole photos, 1.7 for the
    fisheye ones, whose pixels span wider angles). Returns the similarity (scale, rotation, translation) that takes
    SfM's world to the renderer's."""
    found = {image.name: colmap.world_to_cam(image) for image in model.images}
    names = sorted(truth["world_to_cam"])
    assert sorted(found) == names
    true_w2c = [np.array(truth["world_to_cam"][n]) for n in names]
    centres = lambda poses: np.stack([-p[:3, :3].T @ p[:3, 3] for p in poses])  # noqa: E731
    s, rotation, t = similarity(centres([found[n] for n in names]), centres(true_w2c))
    aligned = (s * (rotation @ centres([found[n] for n in names]).T)).T + t
    assert np.abs(aligned - centres(true_w2c)).max() < 0.02 * captures.demo.ORBIT_RADIUS
    for name, w2c in zip(names, true_w2c):  # and each camera looks the way the renderer's did
        axis = rotation @ found[name][2, :3]
        assert np.arccos(np.clip(axis @ w2c[2, :3], -1, 1)) < 3 / truth["focal"]
    return s, rotation, t


def test_sfm_finds_the_cameras_the_renderer_used(photos, capsys, tmp_path):
    folder, truth = photos
    scene = tmp_path / "photos"
    shutil.copytree(folder, scene)
    code, out, err = run_cli(capsys, "sfm", scene)
    assert code == 0, err
    assert "16 of 16 images registered" in out and "exhaustive matching" in out, out
    for phase, total in (("features", 16), ("matching", 120), ("mapping", 16)):  # a bar per phase, with counts
        assert f"{phase}: 100%" in err and f"{total}/{total}" in err, err[-800:]
    stats = json.loads((scene / "sparse" / "0" / "turbogs_sfm.json").read_text())
    assert stats["registered"] == 16 and stats["points"] > 100 and stats["mean_reprojection_error"] < 1.0
    assert set(stats["seconds"]) == {"features", "matching", "mapping"}

    model = colmap.read_model(scene / "sparse" / "0")  # our own reader: the files are COLMAP's binary layout
    assert_the_renderers_cameras(model, truth)
    focal = model.cameras[model.images[0].camera_id].params[0]
    assert abs(focal / truth["focal"] - 1) < 0.02

    # a video's flags on a folder are one line
    code, _, err = run_cli(capsys, "sfm", scene, "--frames", 10)
    assert code == 2 and "--frames is for a video" in err and len(err.strip().splitlines()) == 1

    # a second run reuses the model; --force runs SfM again
    code, out, _ = run_cli(capsys, "sfm", scene)
    assert code == 0 and "using the COLMAP model" in out and "registered" not in out
    code, out, _ = run_cli(capsys, "sfm", scene, "--force", "--quiet")
    assert code == 0 and "16 of 16 images registered" in out


def test_train_on_a_folder_of_photos(photos, capsys, tmp_path):
    scene = tmp_path / "photos"
    shutil.copytree(photos[0], scene)
    code, out, err = run_cli(capsys, "train", scene, "--steps", 20, "--eval", "--out", tmp_path / "model", "--quiet")
    assert code == 0, err
    assert "16 of 16 images registered" in out and "14 train / 2 test views" in out, out
    assert "images='.'" in (tmp_path / "model" / "cfg_args").read_text()  # eval and render find the photos again
    code, out, err = run_cli(capsys, "eval", tmp_path / "model")
    assert code == 0, err


def orbit_clip(path, frames, blur_every=0):
    """An H.264 clip of a ring around the speckled scene; every `blur_every`-th frame blurred."""
    from turbogs.render.mp4 import H264Writer

    writer = H264Writer(path, (captures.PHOTO_WIDTH, captures.PHOTO_HEIGHT), 10)
    primitives = captures.speckled_primitives()
    for k, w2c in enumerate(captures.orbit_frames(frames)):
        rgb = captures.demo.to_uint8(captures.render_photo(primitives, w2c))
        if blur_every and k % blur_every:
            rgb = cv2.GaussianBlur(rgb, (0, 0), 2.5)
        writer.write(rgb)
    writer.close()
    return path


def test_train_on_a_video(capsys, tmp_path):
    """The issue's video end to end: an orbit clip -> the sharpest frames -> SfM (sequential) -> a model."""
    clip = orbit_clip(tmp_path / "clip.mp4", 24)
    code, out, err = run_cli(capsys, "train", clip, "--steps", 20, "--out", tmp_path / "model", "--quiet")
    assert code == 0, err
    assert "video clip.mp4: 24 frames" in out and "sequential matching" in out, out
    assert len(list((tmp_path / "clip" / "images").glob("frame_*.jpg"))) == 24
    registered = json.loads((tmp_path / "clip" / "sparse" / "0" / "turbogs_sfm.json").read_text())["registered"]
    assert registered >= 20
    assert (tmp_path / "model" / "cameras.json").is_file()


def test_the_sharpest_frame_of_each_window_is_kept(tmp_path):
    clip = orbit_clip(tmp_path / "blurry.mp4", 12, blur_every=3)  # frames 0, 3, 6, 9 are the sharp ones
    kept = video_frames.extract_frames(clip, tmp_path / "frames", count=4, progress=False, log=lambda _: None)
    assert len(kept) == 4
    primitives = captures.speckled_primitives()
    poses = captures.orbit_frames(12)
    for index, path in zip((0, 3, 6, 9), kept):
        truth = captures.demo.to_uint8(captures.render_photo(primitives, poses[index])).astype(float)
        frame = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB).astype(float)
        assert np.abs(frame - truth).mean() < 6, path


def test_one_camera_per_folder_only_when_the_photos_agree(tmp_path):
    folder = PhotoFolder(tmp_path, tmp_path, ["a/1.jpg", "a/2.jpg", "b/3.jpg"])
    same = {"a/1.jpg": (4, 3), "a/2.jpg": (4, 3), "b/3.jpg": (8, 6)}  # folders may differ from each other
    assert camera_mode(folder, lambda p: same[p.relative_to(tmp_path).as_posix()]) == "PER_FOLDER"
    mixed = {**same, "a/2.jpg": (3, 4)}
    assert camera_mode(folder, lambda p: mixed[p.relative_to(tmp_path).as_posix()]) == "PER_IMAGE"


def test_a_split_model_keeps_the_largest_and_says_so(tmp_path):
    summary = SfmSummary(total_images=30, registered=20, models=[20, 7], points=900, reprojection_error=0.7,
                         matching="exhaustive", camera_mode="PER_FOLDER", seconds={"features": 1.0})
    summary.check(tmp_path, 3)
    assert any("split into 2 models (20, 7 images); kept the largest: 10 images left out" in line
               for line in summary.lines())
    summary.registered, summary.models = 12, [12, 11, 7]
    with pytest.raises(InputError, match="registered only 12 of 30 photos .*split into 3 models.*try more photos"):
        summary.check(tmp_path, 3)


def test_the_photo_scan_skips_what_turbogs_and_colmap_write(tmp_path):
    for name in ("a.JPG", "b.png", "sub/c.jpeg", "sparse/0/x.png", "images_2/a.JPG", ".turbogs_cache/x.png",
                 "notes.txt"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    assert find_photos(tmp_path).names == ["a.JPG", "b.png", "sub/c.jpeg"]


def noise_photos(folder, count):
    """Photos that share nothing: independent noise."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(3)
    for k in range(count):
        cv2.imwrite(str(folder / f"n{k}.png"), cv2.GaussianBlur(rng.integers(0, 255, (144, 192, 3), np.uint8), (0, 0), 1))


@pytest.mark.parametrize("case", ["empty folder", "one image", "no overlap", "corrupt video", "two-frame video",
                                  "no pycolmap"])
def test_bad_inputs_are_one_line_and_exit_2(case, capsys, tmp_path, photos, monkeypatch):
    target = tmp_path / "in"
    if case == "empty folder":
        target.mkdir()
    elif case == "one image":
        target.mkdir()
        shutil.copy(photos[0] / "IMG_0000.png", target)
    elif case == "no overlap":
        noise_photos(target, 4)
    elif case == "corrupt video":
        target = tmp_path / "broken.mp4"
        target.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 8)
    elif case == "two-frame video":
        target = orbit_clip(tmp_path / "short.mp4", 2)
    elif case == "no pycolmap":
        shutil.copytree(photos[0], target)
        monkeypatch.setitem(sys.modules, "pycolmap", None)  # import pycolmap raises ImportError
    expected = {"empty folder": "no photos found", "one image": "1 photo found", "no overlap": "SfM registered",
                "corrupt video": "cannot read video", "two-frame video": "has 2 frames",
                "no pycolmap": 'pip install -e ".[capture]"'}[case]
    for command in ("sfm", "train"):
        code, _, err = run_cli(capsys, command, target, "--quiet")
        if case == "empty folder" and command == "train":  # not a capture of any kind yet
            expected = "and photos (for SfM)"
        lines = [line for line in err.splitlines() if line.strip() and "%|" not in line]
        assert code == 2 and len(lines) == 1 and expected in lines[0] and "Traceback" not in err, (command, err)
        if case in ("no overlap", "no pycolmap"):
            break  # one SfM run is enough: train runs the same code
    assert not (tmp_path / "in" / "sparse" / "0").exists()


def test_the_camera_model_sfm_fits_is_a_choice(photos, capsys, tmp_path):
    scene = tmp_path / "photos"
    shutil.copytree(photos[0], scene)
    code, out, err = run_cli(capsys, "sfm", scene, "--camera-model", "PINHOLE", "--quiet")
    assert code == 0, err
    model = colmap.read_model(scene / "sparse" / "0")
    assert {camera.model for camera in model.cameras.values()} == {"PINHOLE"}

    # `turbogs train PHOTOS/` passes turbogs sfm's flags on (it used to run SfM at the defaults).
    scene = tmp_path / "photos_train"
    shutil.copytree(photos[0], scene)
    code, out, err = run_cli(capsys, "train", scene, "--camera-model", "PINHOLE", "--matching", "sequential",
                             "--steps", 2, "--out", tmp_path / "model", "--quiet")
    assert code == 0, err
    model = colmap.read_model(scene / "sparse" / "0")
    assert {camera.model for camera in model.cameras.values()} == {"PINHOLE"}
    assert json.loads((scene / "sparse" / "0" / "turbogs_sfm.json").read_text())["matching"] == "sequential"


def torchrun(*args):
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "turbogs", *map(str, args)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


@pytest.mark.slow
def test_torchrun_ranks_run_sfm_once_and_train_on_its_model(photos, tmp_path):
    """Under torchrun every rank runs `turbogs train PHOTOS/`: rank 0 alone runs the SfM (its log
    comes once; a rank that ran its own would print it too), the other waits and reads rank 0's
    model. Both train from it: the trainer compares the ranks' parameters at step CHECKSUM_EVERY,
    which initial points from two different SfM models would fail."""
    from turbogs.training.trainer import CHECKSUM_EVERY

    scene = tmp_path / "photos"
    shutil.copytree(photos[0], scene)
    done = torchrun("train", scene, "--steps", CHECKSUM_EVERY, "--quiet", "--out", tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("structure from motion on 16 photos") == 1, done.stdout
    assert done.stdout.count("16 of 16 images registered") == 1 and "x 2 ranks (gloo)" in done.stdout
    assert done.stdout.count(f"done: {CHECKSUM_EVERY} steps") == 1, done.stdout
    assert "using the COLMAP model" not in done.stdout  # the waiting rank reads it silently
    assert [p.name for p in (scene / "sparse").iterdir()] == ["0"]  # one model, no staging left over

    # rank 0's SfM fails: every rank stops, and the reason is said once
    noise_photos(tmp_path / "noise", 4)
    done = torchrun("train", tmp_path / "noise", "--steps", 5, "--quiet", "--out", tmp_path / "run2")
    assert done.returncode != 0
    ours = [line for line in done.stderr.splitlines() if line.startswith("turbogs train: ")]  # not torchrun's report
    assert len(ours) == 1 and "SfM registered none of the 4 photos" in ours[0], done.stderr
    assert not (tmp_path / "noise" / "sparse" / "0").exists()


def test_fisheye_photos_through_sfm_and_undistorted_on_load(capsys, tmp_path):
    """Photos of a 137-degree fisheye (rays bent by the ray caster from OPENCV_FISHEYE's formula):
    `turbogs sfm --camera-model OPENCV_FISHEYE` finds the renderer's cameras and focal length, and
    each view loaded from that model is undistorted into what the ray caster sees through a pinhole
    camera with the loaded K, at the loaded pose taken into the renderer's world. Blurred, to weigh
    the geometry rather than the speckle's finest grain: 26-27 dB here; the photos read as if
    pinhole (undistortion skipped) score 19-21 dB."""
    from turbogs.data.load import load_scene

    folder = captures.make_capture("fisheye_photos", str(tmp_path))
    truth = json.loads((tmp_path / "fisheye_photos_poses.json").read_text())
    code, out, err = run_cli(capsys, "sfm", folder, "--camera-model", "OPENCV_FISHEYE", "--quiet")
    assert code == 0, err
    assert "16 of 16 images registered" in out, out
    model = colmap.read_model(tmp_path / "fisheye_photos" / "sparse" / "0")
    (camera,) = model.cameras.values()
    assert camera.model == "OPENCV_FISHEYE" and abs(camera.params[0] / truth["focal"] - 1) < 0.03
    s, rotation, t = assert_the_renderers_cameras(model, truth)

    blur = lambda image: cv2.GaussianBlur(np.asarray(image, np.float32), (0, 0), 2.0)  # noqa: E731
    scene = load_scene(folder, images=".", log=lambda _: None)
    primitives = captures.speckled_primitives()
    for view in scene.train[::4]:
        w2c = view.world_to_cam.double().numpy()
        in_truth = np.eye(4)  # x_cam = R_c x_sfm + t_c and x_true = s R x_sfm + t, in the renderer's units
        in_truth[:3, :3] = w2c[:3, :3] @ rotation.T
        in_truth[:3, 3] = s * w2c[:3, 3] - in_truth[:3, :3] @ t
        seen, _ = captures.render(primitives, in_truth, view.K.double().numpy(), view.width, view.height, supersample=1)
        error = float(((blur(view.image.numpy()) - blur(seen)) ** 2).mean())
        assert -10 * np.log10(error) > 24.0, view.name


def test_a_second_mapping_pass_registers_the_photos_the_first_left_out(capsys, tmp_path):
    """One camera per photo (every other photo smaller): COLMAP's first mapping pass registered 8 of
    the 16 in each of 3 runs; `turbogs sfm` then continues the model over the 8 left out with
    relaxed registration (sfm.RETRY_MAPPER), which registered 15-16 in 3 runs. Without the second
    pass the same photos stay far short."""
    from turbogs.capture.sfm import SfmOptions, run_sfm
    from turbogs.capture.summary import SfmTooFew

    folder = captures.make_capture("mixed_photos", str(tmp_path))
    code, out, err = run_cli(capsys, "sfm", folder, "--quiet")
    assert code == 0, err
    stats = json.loads((tmp_path / "mixed_photos" / "sparse" / "0" / "turbogs_sfm.json").read_text())
    assert stats["camera_mode"] == "PER_IMAGE" and stats["registered"] >= 14 and stats["retried"] > 0, stats
    assert f"the second mapping pass registered {stats['retried']} of the images the first left out" in out
    model = colmap.read_model(tmp_path / "mixed_photos" / "sparse" / "0")
    assert {(c.width, c.height) for c in model.cameras.values()} == {(192, 144), (160, 120)}

    shutil.rmtree(tmp_path / "mixed_photos" / "sparse")
    try:
        once = run_sfm(find_photos(folder), SfmOptions(progress=False, retry=False), log=lambda _: None)
    except SfmTooFew as exc:
        once = exc.summary
    assert once.registered <= stats["registered"] - 3 and once.retried == 0


def test_thorough_registers_photos_of_little_overlap(capsys, tmp_path):
    """10 photos 36 degrees apart on the ring: the default settings registered none (3 runs), and
    say to try --thorough; guided matching with twice the features, then the second pass,
    registered 8 of 10 (3 runs)."""
    folder = tmp_path / "ring10"
    captures.make_mixed_photos(str(folder), 10, None)
    code, _, err = run_cli(capsys, "sfm", folder, "--quiet")
    assert code == 2 and err.count("\n") == 1 and "SfM registered none of the 10" in err and "--thorough" in err, err
    code, out, err = run_cli(capsys, "sfm", folder, "--quiet", "--thorough")
    assert code == 0, err
    stats = json.loads((folder / "sparse" / "0" / "turbogs_sfm.json").read_text())
    assert stats["registered"] >= 7 and stats["thorough"], stats
    assert "--thorough may register more" not in out  # the hint is for runs without it


def test_a_waiting_rank_never_runs_sfm_itself(photos, tmp_path):
    """prepare(sfm_here=False), what torchrun's ranks other than 0 run after rank 0's SfM: where the
    model (or a video's frames) is missing, as on a machine that does not share the folder, it is one
    line naming the shared file system, and no SfM runs."""
    from turbogs.capture.prepare import prepare

    scene = tmp_path / "photos"
    shutil.copytree(photos[0], scene)
    with pytest.raises(InputError, match=r"no COLMAP model in .*sparse/0, which rank 0's SfM wrote.*shared file"):
        prepare(scene, sfm_here=False, log=lambda _: None)
    assert not (scene / "sparse").exists()
    (tmp_path / "clip.mp4").write_bytes(b"")
    with pytest.raises(InputError, match=r"no frames in .*clip/images, which rank 0's SfM wrote"):
        prepare(tmp_path / "clip.mp4", sfm_here=False, log=lambda _: None)


_HAMMER = """
import sys, threading, time
from pathlib import Path
import pycolmap
from turbogs.capture.sfm import _count_rows
database, images = Path(sys.argv[1]), Path(sys.argv[2])
stop = []

def poll():  # the bar's read, hundreds of times a second instead of once
    while not stop:
        _count_rows(database, "keypoints")
        time.sleep(0.0005)

threading.Thread(target=poll, daemon=True).start()
options = pycolmap.FeatureExtractionOptions()
options.num_threads = 1
pycolmap.extract_features(database, images, extraction_options=options)
stop.append(True)
print("extracted", _count_rows(database, "keypoints"))
"""


def test_the_progress_bars_reads_never_make_colmap_abort(tmp_path):
    """COLMAP sets no busy timeout: a reader's lock, met at the instant it commits, aborts the whole
    process ("database is locked"). With a reader that locks, polled like this, a third to a half
    of the extractions aborted (so six pass together about 5 % of the time); the bar's lock-free
    read must survive being polled thousands of times more often than the bar does."""
    images = REPO / "scenes" / "demo" / "images"
    for attempt in range(6):
        run = subprocess.run([sys.executable, "-c", _HAMMER, str(tmp_path / f"db{attempt}.db"), str(images)],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert run.returncode == 0, run.stderr[-2000:]
        assert run.stdout.split() == ["extracted", str(len(os.listdir(images)))]
