""".spz and .sog: round trips within each format's quantisation error, the byte layout read
back by hand, corrupt files refused in one line; `turbogs export` and `render --path` through
the real CLI (formats, bad input, the MP4 read back with OpenCV)."""

import gzip
import json
import math
import struct
import zipfile

import cv2
import numpy as np
import pytest

from turbogs.cli import main
from turbogs.errors import InputError
from turbogs.formats import read_gaussians, sog, spz
from turbogs.formats.model_folder import camera_json_entry, load_model
from turbogs.formats.ply import read_ply, write_ply
from turbogs.render.camera_paths import look_at


def random_params(n=600, degree=3, seed=0, extent=2.0):
    rng = np.random.default_rng(seed)
    rest = {0: 0, 1: 3, 2: 8, 3: 15}[degree]
    return {
        "means": rng.uniform(-extent, extent, (n, 3)).astype(np.float32),
        "scales": rng.uniform(-6, -1, (n, 3)).astype(np.float32),
        "quats": rng.normal(size=(n, 4)).astype(np.float32),
        "opacities": rng.uniform(-5, 5, n).astype(np.float32),
        "sh0": rng.uniform(-1.5, 1.5, (n, 1, 3)).astype(np.float32),
        "shN": rng.uniform(-0.4, 0.4, (n, rest, 3)).astype(np.float32),
    }


def unit(q):
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def sigmoid(x):
    return 1 / (1 + np.exp(-x.astype(np.float64)))


def assert_same_rotation(decoded, original, bound):
    """Unit quaternions equal up to sign, each component within `bound`."""
    a, b = unit(decoded.astype(np.float64)), unit(original.astype(np.float64))
    b = b * np.sign((a * b).sum(1, keepdims=True))
    assert np.abs(a - b).max() <= bound + 1e-6


def assert_within_spz_error(original, decoded):
    e = spz.MAX_ERROR
    slack = 1e-5
    assert np.abs(decoded["means"] - original["means"]).max() <= e["means"] + slack
    assert np.abs(decoded["scales"] - original["scales"]).max() <= e["scales"] + slack
    assert np.abs(sigmoid(decoded["opacities"]) - sigmoid(original["opacities"])).max() <= e["alpha"] + slack
    assert np.abs(decoded["sh0"] - original["sh0"]).max() <= e["sh0"] + slack
    assert_same_rotation(decoded["quats"], original["quats"], e["quat"])
    rest = original["shN"].shape[1]
    if rest:
        assert np.abs(decoded["shN"][:, :3] - original["shN"][:, :3]).max() <= e["sh1"] + slack
        if rest > 3:
            assert np.abs(decoded["shN"][:, 3:] - original["shN"][:, 3:]).max() <= e["sh_rest"] + slack


def nearest_entry(codebook, values):
    codebook = np.asarray(codebook, np.float64)
    return codebook[np.abs(values.astype(np.float64)[..., None] - codebook).argmin(-1)]


def assert_within_sog_error(original, decoded, meta):
    """Fixed-step planes within their step; codebook planes exactly the nearest codebook entry."""
    order = sog.morton_order(original["means"].astype(np.float64))
    o = {k: v[order] for k, v in original.items()}
    logs = sog.log_transform(o["means"].astype(np.float64))
    step = (np.asarray(meta["means"]["maxs"]) - np.asarray(meta["means"]["mins"])) / 65535
    bound = 0.5 * step * np.exp(np.abs(logs) + step) + 1e-6  # d|x|/dv = exp(|v|): half a step, mapped back
    assert (np.abs(decoded["means"] - o["means"]) <= bound).all()
    assert np.abs(sigmoid(decoded["opacities"]) - sigmoid(o["opacities"])).max() <= sog.MAX_ERROR["alpha"] + 1e-6
    assert_same_rotation(decoded["quats"], o["quats"], sog.MAX_ERROR["quat"])
    assert np.allclose(decoded["scales"], nearest_entry(meta["scales"]["codebook"], o["scales"]), atol=1e-6)
    assert np.allclose(decoded["sh0"], nearest_entry(meta["sh0"]["codebook"], o["sh0"]), atol=1e-6)
    if o["shN"].shape[1]:  # SH vectors share a k-means palette: each value is a codebook entry, and the
        # palette does much better than the best single vector (the mean)
        shn = decoded["shN"].astype(np.float64)
        assert np.allclose(shn, nearest_entry(meta["shN"]["codebook"], shn), atol=1e-6)
        error = np.sqrt(((shn - o["shN"]) ** 2).mean())
        spread = np.sqrt(((o["shN"] - o["shN"].mean(0)) ** 2).mean())
        assert error < 0.8 * spread


# --- .spz ------------------------------------------------------------------------------------


@pytest.mark.parametrize("degree", [0, 1, 3])
def test_spz_round_trip_within_its_quantisation(tmp_path, degree):
    params = random_params(degree=degree)
    spz.write_spz(tmp_path / "m.spz", params)
    decoded, read_degree = spz.read_spz(tmp_path / "m.spz")
    assert read_degree == degree
    assert_within_spz_error(params, decoded)


def test_spz_bytes_follow_the_published_layout(tmp_path):
    params = random_params(n=3, degree=1)
    params["means"][0] = [1.0, 2.0, -0.5]
    params["quats"][0] = [1, 0, 0, 0]
    body = gzip.decompress(spz.encode(params))
    magic, version, n, degree, bits, flags, reserved = struct.unpack_from("<IIIBBBB", body)
    assert (magic, version, n, degree, bits, flags, reserved) == (0x5053474E, 3, 3, 1, 12, 0, 0)
    assert len(body) == 16 + n * (9 + 1 + 3 + 3 + 4 + 9)
    fixed = [int.from_bytes(body[16 + 3 * i:19 + 3 * i], "little", signed=True) for i in range(3)]
    assert fixed == [4096, -8192, 2048]  # RUB: y and z flipped, 12 fractional bits
    rot = int.from_bytes(body[16 + 16 * n:20 + 16 * n], "little")
    assert rot >> 30 == 3 and rot & 0x3FFFFFFF == 0  # identity: w (index 3 in x y z w) is the largest


def test_spz_sh_sign_flips_are_the_real_sh_parities_in_y_and_z():
    # Standard real SH basis (up to constants): degree 1 y z x; degree 2 xy yz (3z^2-1) xz (x^2-y^2);
    # degree 3 y(3x^2-y^2) xyz y(4z^2-..) z(2z^2-..) x(4z^2-..) z(x^2-y^2) x(x^2-3y^2). Flip y, z:
    expected = [-1, -1, 1, -1, 1, 1, -1, 1, -1, 1, -1, -1, 1, -1, 1]
    assert spz.sh_flip_signs(15).tolist() == expected


def test_spz_large_scenes_use_fewer_fractional_bits(tmp_path):
    params = random_params(n=50, degree=0, extent=5000.0)
    decoded, _ = spz.decode(spz.encode(params))
    body = gzip.decompress(spz.encode(params))
    assert body[13] < 12
    assert np.abs(decoded["means"] - params["means"]).max() <= 0.5 / 2 ** body[13] + 1e-3


@pytest.mark.parametrize("damage", ["truncated", "magic", "not gzip", "v4"])
def test_spz_corrupt_files_are_refused(tmp_path, damage):
    body = bytearray(gzip.decompress(spz.encode(random_params(n=20, degree=1))))
    if damage == "truncated":
        data = gzip.compress(bytes(body[:-7]))
    elif damage == "magic":
        body[0] ^= 0xFF
        data = gzip.compress(bytes(body))
    elif damage == "not gzip":
        data = b"hello, not a splat"
    else:
        data = b"NGSP" + bytes(28)
    (tmp_path / "bad.spz").write_bytes(data)
    with pytest.raises(InputError, match="bad .spz file"):
        spz.read_spz(tmp_path / "bad.spz")


# --- .sog ------------------------------------------------------------------------------------


@pytest.mark.parametrize("degree", [0, 2, 3])
def test_sog_round_trip_within_its_quantisation(tmp_path, degree):
    params = random_params(n=500, degree=degree, seed=degree)
    sog.write_sog(tmp_path / "m.sog", params)
    with zipfile.ZipFile(tmp_path / "m.sog") as archive:
        names = archive.namelist()
        meta = json.loads(archive.read("meta.json"))
        assert all(info.compress_type == zipfile.ZIP_STORED for info in archive.infolist())
    assert names[0] == "meta.json" and meta["version"] == 2 and meta["count"] == 500
    assert ("shN" in meta) == (degree > 0) and (degree == 0 or meta["shN"]["bands"] == degree)
    decoded, read_degree = sog.read_sog(tmp_path / "m.sog")
    assert read_degree == degree
    assert_within_sog_error(params, decoded, meta)


def test_sog_textures_are_lossless_webp_even_for_invisible_gaussians(tmp_path):
    params = random_params(n=64, degree=0)
    params["opacities"][:] = -30.0  # sigmoid ~ 0: the alpha byte would be 0, which WebP may strip RGB from
    decoded, _ = sog.decode(sog.encode(params))
    assert np.abs(sigmoid(decoded["opacities"])).max() <= 1.0 / 255 + 1e-6
    order = sog.morton_order(params["means"].astype(np.float64))
    meta = json.loads(sog.encode(params)["meta.json"])
    assert np.allclose(decoded["sh0"], nearest_entry(meta["sh0"]["codebook"], params["sh0"][order]), atol=1e-6)


def test_sog_kmeans_clusters_the_sh_palette_when_it_is_smaller_than_the_model():
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(8, 9))
    points = centres[rng.integers(0, 8, 4000)] + 0.01 * rng.normal(size=(4000, 9))
    found, labels = sog.kmeans(points, 8, iterations=30)
    distances = ((points[:, None, :] - found[None]) ** 2).sum(-1)
    assert np.array_equal(labels, distances.argmin(1))  # each point labelled with its nearest centroid
    for c in np.unique(labels):  # each centroid the mean of its points (Lloyd's fixed point)
        assert np.allclose(found[c], points[labels == c].mean(0), atol=1e-4)
    assert distances.min(1).mean() < 0.5 * ((points - points.mean(0)) ** 2).sum(1).mean()
    codebook, labels_1d = sog.kmeans_1d(rng.normal(size=10000), 16)
    assert np.all(np.diff(codebook) >= 0) and labels_1d.max() == 15


def test_sog_that_is_not_a_zip_is_refused(tmp_path):
    (tmp_path / "bad.sog").write_bytes(b"PK but not really")
    with pytest.raises(InputError, match="bad .sog file"):
        sog.read_sog(tmp_path / "bad.sog")


# --- the CLI ---------------------------------------------------------------------------------


def small_model(folder, n=400, cameras=6, degree=1):
    """A model folder: a ball of coloured Gaussians, and a ring of cameras looking at it."""
    rng = np.random.default_rng(0)
    params = random_params(n=n, degree=degree, extent=0.6)
    params["scales"][:] = np.log(0.05)
    params["opacities"][:] = 3.0
    params["shN"][:] = 0.0
    (folder / "point_cloud" / "iteration_10").mkdir(parents=True)
    write_ply(folder / "point_cloud" / "iteration_10" / "point_cloud.ply", params)
    entries = []
    for i, a in enumerate(np.linspace(0, 2 * math.pi, cameras, endpoint=False)):
        pose = look_at(np.array([3 * math.cos(a), -0.5 + 0.1 * rng.normal(), 3 * math.sin(a)]), np.zeros(3),
                       np.array([0.0, -1.0, 0.0]))
        entries.append({"id": i, "img_name": f"view_{i:02d}", "width": 80, "height": 60, "position": pose[:3, 3].tolist(),
                        "rotation": pose[:3, :3].tolist(), "fx": 70.0, "fy": 70.0})
    (folder / "cameras.json").write_text(json.dumps(entries))
    return folder, params


def run_cli(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err.strip()


def test_cameras_json_entries_are_what_the_video_reads(tmp_path):
    """Guard: the cameras.json our trainer writes has the fields the path reader takes."""
    import torch

    from turbogs.data.scene import Camera

    cam = Camera("a.png", 80, 60, torch.tensor([[70.0, 0, 40], [0, 70, 30], [0, 0, 1]]), torch.eye(4))
    assert {"position", "rotation", "fx", "fy", "width", "height", "img_name"} <= set(camera_json_entry(0, cam))


@pytest.mark.parametrize("fmt", ["ply", "splat", "spz", "sog"])
def test_export_writes_each_format_and_the_readable_ones_load_back(tmp_path, capsys, fmt):
    model, params = small_model(tmp_path / "model")
    code, out, _ = run_cli(capsys, "export", model, "--format", fmt, "-o", tmp_path / f"m.{fmt}")
    assert code == 0 and f"m.{fmt}" in out
    if fmt == "splat":
        assert (tmp_path / "m.splat").stat().st_size == 32 * len(params["means"])
        return
    loaded, degree, _ = load_model(tmp_path / f"m.{fmt}")
    assert degree == 1 and len(loaded["means"]) == len(params["means"])
    # the format comes from the extension when --format is left out
    assert run_cli(capsys, "export", model, "-o", tmp_path / f"again.{fmt}")[0] == 0
    assert read_gaussians(tmp_path / f"again.{fmt}")[1] == 1


def empty_model(tmp_path):
    """A well-formed INRIA .ply with zero vertices (what a run that pruned everything leaves)."""
    from turbogs.formats.ply import vertex_field_names

    header = ["ply", "format binary_little_endian 1.0", "element vertex 0"]
    header += [f"property float {name}" for name in vertex_field_names(0)] + ["end_header"]
    (tmp_path / "empty.ply").write_bytes(("\n".join(header) + "\n").encode())
    return tmp_path / "empty.ply"


@pytest.mark.parametrize("case", ["unknown format", "extension disagrees", "unknown extension", "no gaussians",
                                  "interpolate one camera", "video not mp4", "path without output",
                                  "video without path"])
def test_bad_input_gets_one_line_and_exit_2(tmp_path, capsys, case):
    model, _ = small_model(tmp_path / "model", cameras=1 if case == "interpolate one camera" else 4)
    empty = empty_model(tmp_path)
    args = {
        "unknown format": ["export", model, "--format", "obj", "-o", tmp_path / "m.obj"],
        "extension disagrees": ["export", model, "--format", "spz", "-o", tmp_path / "m.sog"],
        "unknown extension": ["export", model, "-o", tmp_path / "m.bin"],
        "no gaussians": ["export", empty, "-o", tmp_path / "m.spz"],
        "interpolate one camera": ["render", model, "--path", "interpolate", "--video", tmp_path / "v.mp4"],
        "video not mp4": ["render", model, "--path", "orbit", "--video", tmp_path / "v.avi"],
        "path without output": ["render", model, "--path", "orbit"],
        "video without path": ["render", model, "--video", tmp_path / "v.mp4"],
    }[case]
    code, _, err = run_cli(capsys, *args)
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not list(tmp_path.glob("m.*")) and not list(tmp_path.glob("*.mp4")) and not list(tmp_path.glob(".*tmp*"))


def test_render_orbit_video_reads_back_with_the_right_frames(tmp_path, capsys):
    model, _ = small_model(tmp_path / "model")
    video, frames = tmp_path / "orbit.mp4", tmp_path / "frames"
    code, out, _ = run_cli(capsys, "render", model, "--path", "orbit", "--video", video, "--frames", 8,
                           "--fps", 12, "--width", 100, "--frames-dir", frames)
    assert code == 0 and "8 frames" in out
    capture = cv2.VideoCapture(str(video))
    assert capture.get(cv2.CAP_PROP_FRAME_COUNT) == 8
    assert (capture.get(cv2.CAP_PROP_FRAME_WIDTH), capture.get(cv2.CAP_PROP_FRAME_HEIGHT)) == (100, 76)
    assert math.isclose(capture.get(cv2.CAP_PROP_FPS), 12, rel_tol=1e-3)
    pngs = sorted(frames.glob("frame_*.png"))
    assert len(pngs) == 8
    ok, first = capture.read()
    png = cv2.imread(str(pngs[0]))
    assert ok and png.shape == first.shape
    assert np.abs(first.astype(float) - png).mean() < 6  # the same picture, up to MPEG-4 loss
    assert png.max() > 60  # the ball is in view, not an empty frame
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary video was renamed away


@pytest.mark.parametrize("kind", ["spiral", "interpolate"])
def test_render_other_paths(tmp_path, capsys, kind):
    model, _ = small_model(tmp_path / "model")
    code, _, err = run_cli(capsys, "render", model, "--path", kind, "--video", tmp_path / "v.mp4", "--frames", 5,
                           "--width", 64)
    assert code == 0, err
    assert cv2.VideoCapture(str(tmp_path / "v.mp4")).get(cv2.CAP_PROP_FRAME_COUNT) == 5


def test_exported_spz_renders_along_a_path_from_the_model_folder_cameras(tmp_path, capsys):
    model, _ = small_model(tmp_path / "model")
    assert run_cli(capsys, "export", model, "-o", model / "m.spz")[0] == 0  # cameras.json sits beside it
    code, _, err = run_cli(capsys, "render", model / "m.spz", "--path", "orbit", "--frames-dir", tmp_path / "f",
                           "--frames", 3, "--width", 48)
    assert code == 0, err
    assert len(list((tmp_path / "f").glob("*.png"))) == 3


def test_ply_reader_is_untouched_by_the_new_formats(tmp_path):
    params = random_params(n=10, degree=2)
    write_ply(tmp_path / "m.ply", params)
    assert np.array_equal(read_gaussians(tmp_path / "m.ply")[0]["means"], read_ply(tmp_path / "m.ply")[0]["means"])


# --- fuzzed readers: a damaged .spz/.sog loads or raises InputError, never anything else ------


def mutate(data: bytes, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    data = bytearray(data)
    kind = seed % 4
    if kind == 0 and data:  # flip a few bytes
        for i in rng.integers(0, len(data), 1 + seed % 5):
            data[i] ^= int(rng.integers(1, 256))
    elif kind == 1:  # truncate
        data = data[: int(rng.integers(0, max(len(data), 1)))]
    elif kind == 2:  # insert junk
        i = int(rng.integers(0, len(data) + 1))
        data[i:i] = rng.integers(0, 256, 1 + seed % 9).astype(np.uint8).tobytes()
    else:  # overwrite a 4-byte field with an extreme number
        if len(data) >= 4:
            i = int(rng.integers(0, len(data) - 3))
            data[i:i + 4] = struct.pack("<I", [0, 0xFFFFFFFF, 0x7FFFFFFF, 1 << 24][seed % 3])
    return bytes(data)


def load_or_input_error(reader, path):
    try:
        reader(path)
    except InputError:
        pass


@pytest.mark.parametrize("seed", range(60))
def test_fuzzed_spz_loads_or_says_why(tmp_path, seed):
    body = gzip.decompress(spz.encode(random_params(n=30, degree=2)))
    damaged = gzip.compress(mutate(body, seed)) if seed % 2 else mutate(gzip.compress(body), seed)
    (tmp_path / "f.spz").write_bytes(damaged)
    load_or_input_error(spz.read_spz, tmp_path / "f.spz")


@pytest.mark.parametrize("seed", range(60))
def test_fuzzed_sog_loads_or_says_why(tmp_path, seed):
    files = sog.encode(random_params(n=40, degree=1))
    if seed % 3 == 0:  # damage the whole archive
        sog.write_sog(tmp_path / "ok.sog", random_params(n=40, degree=1))
        (tmp_path / "f.sog").write_bytes(mutate((tmp_path / "ok.sog").read_bytes(), seed))
    else:  # damage one entry (meta.json or a texture) inside a sound archive
        names = sorted(files)
        name = names[seed % len(names)]
        files[name] = mutate(files[name], seed)
        with zipfile.ZipFile(tmp_path / "f.sog", "w") as archive:
            for key, value in files.items():
                archive.writestr(key, value)
    load_or_input_error(sog.read_sog, tmp_path / "f.sog")


def test_viewer_opens_an_exported_spz_and_sog_with_the_model_cameras(tmp_path, capsys):
    from turbogs.viewer.model_files import load_model as viewer_load

    model, params = small_model(tmp_path / "model")
    for fmt in ("spz", "sog"):
        assert run_cli(capsys, "export", model, "-o", model / f"m.{fmt}")[0] == 0
        loaded = viewer_load(model / f"m.{fmt}")
        assert loaded.num_gaussians == len(params["means"]) and loaded.sh_degree == 1
        assert len(loaded.cameras) == 6  # cameras.json beside the export


def test_eval_scores_an_exported_spz_against_its_capture(tmp_path, capsys):
    """`turbogs eval x.spz` finds the capture through the cfg_args beside the export."""
    from test_cli import DEMO

    model, _ = small_model(tmp_path / "model")
    (model / "cfg_args").write_text(f"Namespace(sh_degree=1, source_path={str(DEMO)!r}, images='images', "
                                    "resolution=-1, white_background=False, eval=True)")
    assert run_cli(capsys, "export", model, "-o", model / "m.spz")[0] == 0
    code, out, err = run_cli(capsys, "eval", model / "m.spz", "--no-images")
    assert code == 0, err
    results = json.loads((model / "m.spz_eval" / "results.json").read_text())
    assert results["num_gaussians"] == 400 and math.isfinite(results["psnr"])
    assert not (model / "results.json").exists()  # the model folder's own results are left alone
