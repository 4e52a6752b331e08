"""Long fuzz run of the scene and model readers: every mutated file must either load or
raise `TurboGSError`; any other exception is a bug (a traceback the user would see).

The same seeds (valid files) and mutators serve the CI-sized hypothesis test
(tests/test_fuzz_readers.py); here they run N times per reader with plain `random`,
without hypothesis's overhead, and the outcomes are counted.

    python benchmarks/fuzz_long.py [--examples 10000] [--seed 0] [--readers colmap_bin ...]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # its COLMAP writer
from colmap_writer import write_model  # noqa: E402

from turbogs.data import colmap
from turbogs.data.images import is_file
from turbogs.data.transforms import GL_TO_CV, read_nerf_synthetic, read_nerfstudio, read_ply_points
from turbogs.errors import TurboGSError
from turbogs.formats.ply import read_ply, write_ply, write_points_ply
from turbogs.geometry import rotmat_to_quat

# --- valid seed files ------------------------------------------------------------------


def _seed_model(rng: np.random.Generator):
    """Two cameras, three images and a few points: small, but every record kind occurs."""
    cameras = [
        colmap.ColmapCamera(1, "PINHOLE", 64, 48, np.array([60.0, 61.0, 32.0, 24.0])),
        colmap.ColmapCamera(2, "OPENCV", 64, 48, np.array([60.0, 60.0, 32.0, 24.0, 0.01, -0.002, 0.0, 0.001])),
    ]
    images = [
        colmap.ColmapImage(i + 1, rotmat_to_quat(np.eye(3)), rng.normal(size=3), 1 + i % 2, f"img_{i}.png")
        for i in range(3)
    ]
    points = rng.normal(size=(4, 3))
    colors = rng.integers(0, 256, size=(4, 3)).astype(np.uint8)
    return cameras, images, points, colors


def write_seeds(folder: Path) -> Dict[str, Dict[str, bytes]]:
    """reader name -> {file name: valid bytes}: the files each reader is fuzzed on."""
    rng = np.random.default_rng(0)
    cameras, images, points, colors = _seed_model(rng)
    seeds: Dict[str, Dict[str, bytes]] = {}
    for binary, name in ((True, "colmap_bin"), (False, "colmap_txt")):
        model = folder / name
        write_model(model, cameras, images, points, colors, binary=binary)
        seeds[name] = {f.name: f.read_bytes() for f in sorted(model.iterdir())}

    frames = []
    for i in range(3):
        cam_to_world = np.eye(4)
        cam_to_world[:3, 3] = rng.normal(size=3)
        frames.append({"file_path": f"images/img_{i}.png", "transform_matrix": (cam_to_world @ GL_TO_CV).tolist(),
                       **({"fl_x": 55.5, "k1": 0.01} if i == 2 else {})})
    nerfstudio = {"fl_x": 60.0, "fl_y": 61.0, "cx": 32.0, "cy": 24.0, "w": 64, "h": 48, "k1": 0.0,
                  "camera_model": "OPENCV", "ply_file_path": "points.ply", "frames": frames}
    seeds["transforms"] = {"transforms.json": json.dumps(nerfstudio, indent=1).encode()}
    synthetic = {"camera_angle_x": 0.69, "frames": [{"file_path": "./images/img_0", "rotation": 0.1,
                                                    "transform_matrix": frames[0]["transform_matrix"]}]}
    seeds["transforms_synthetic"] = {"transforms_train.json": json.dumps(synthetic, indent=1).encode()}

    n = 4
    params = {"means": rng.normal(size=(n, 3)), "scales": rng.normal(size=(n, 3)), "quats": rng.normal(size=(n, 4)),
              "opacities": rng.normal(size=n), "sh0": rng.normal(size=(n, 1, 3)), "shN": rng.normal(size=(n, 3, 3))}
    write_ply(folder / "model.ply", params)
    seeds["ply"] = {"model.ply": (folder / "model.ply").read_bytes()}
    write_points_ply(folder / "points.ply", points, colors)
    seeds["points_ply"] = {"points.ply": (folder / "points.ply").read_bytes()}
    return seeds


# --- mutators: valid bytes -> plausibly broken bytes -------------------------------------

# Tokens that stress number parsing and sizes in the text formats.
TEXT_TOKENS = [b"nan", b"inf", b"-inf", b"-1", b"0", b"1e400", b"-0", b"99999999999999999999999", b"1e-400",
               b"\x00", b"\xff\xfe", b"#", b"\n", b" ", b"PINHOLE", b"OPENCV_FISHEYE", b"[", b"]", b"{", b"}",
               b'"', b",", b":", b"null", b"true", b"NaN", b"Infinity", b"[[1,2],[3]]", b'"x"', b"{}", b"[]",
               b"1" * 400, b"element vertex 1000000000000", b"property list uchar int x", b"property float x",
               b"format ascii 1.0", b"end_header\n", b"comment", b"..", b"/", b"a" * 300]


def flip_bytes(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if out:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def set_bytes(data: bytes, rng: random.Random) -> bytes:
    """Overwrite a few bytes with extreme values (0x00, 0xff, 0x7f, 0x80): wrong counts, ids, sizes."""
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        if out:
            start = rng.randrange(len(out))
            fill = rng.choice([0x00, 0xFF, 0x7F, 0x80])
            for i in range(start, min(len(out), start + rng.choice([1, 2, 4, 8]))):
                out[i] = fill
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def insert_random(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return data[:at] + junk + data[at:]


def insert_token(data: bytes, rng: random.Random) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + rng.choice(TEXT_TOKENS) + data[at:]


def replace_token(data: bytes, rng: random.Random) -> bytes:
    """Replace one whitespace-separated word (a number, a name, a JSON value) by a stress token."""
    words = data.split(b" ")
    i = rng.randrange(len(words))
    tail = b"\n" if words[i].endswith(b"\n") else b""
    words[i] = rng.choice(TEXT_TOKENS) + tail
    return b" ".join(words)


def edit_lines(data: bytes, rng: random.Random) -> bytes:
    """Delete, duplicate or add a line: header lines, records, comments."""
    lines = data.split(b"\n")
    i = rng.randrange(len(lines))
    action = rng.randrange(3)
    if action == 0:
        del lines[i]
    elif action == 1:
        lines.insert(i, lines[rng.randrange(len(lines))])
    else:
        lines.insert(i, b" ".join(rng.choice(TEXT_TOKENS) for _ in range(rng.randint(1, 5))))
    return b"\n".join(lines)


def splice(data: bytes, rng: random.Random) -> bytes:
    """Move a chunk of the file elsewhere: records out of order, fields shifted."""
    if len(data) < 2:
        return data
    a, b = sorted(rng.randrange(len(data)) for _ in range(2))
    chunk, rest = data[a:b], data[:a] + data[b:]
    at = rng.randrange(len(rest) + 1)
    return rest[:at] + chunk + rest[at:]


# JSON values that a hand-edited or foreign transforms.json might hold where numbers,
# lists or strings are expected.
JSON_VALUES = [None, True, 0, -1, 1e308, 10**400, -(10**30), float("nan"), float("inf"), "", "x", "../" * 50,
               "a" * 5000, "img\u0000.png", [], {}, [1, 2], [[1, 2, 3, 4]] * 3, [[1, 2, 3, 4]] * 4 + [[0]],
               [[0, 0, 0, 0]] * 4, [["a"] * 4] * 4, [[10**400] * 4] * 4, [[1e308] * 4] * 4]


def _json_paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _json_paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _json_paths(item, prefix + (index,))


def mutate_json(data: bytes, rng: random.Random) -> bytes:
    """Replace or delete one value anywhere in a JSON document (bytes that are not JSON
    are flipped instead): wrong types, huge or non-finite numbers, missing keys."""
    try:
        document = json.loads(data)
    except ValueError:
        return flip_bytes(data, rng)
    paths = list(_json_paths(document))[1:]
    if not paths:
        return json.dumps(rng.choice(JSON_VALUES)).encode()
    path = rng.choice(paths)
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if rng.random() < 0.3:
        del parent[path[-1]]
    else:
        parent[path[-1]] = rng.choice(JSON_VALUES)
    return json.dumps(document).encode()


MUTATORS: List[Callable[[bytes, random.Random], bytes]] = [
    flip_bytes, set_bytes, truncate, insert_random, insert_token, replace_token, edit_lines, splice, mutate_json]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to three mutations in a row."""
    for _ in range(rng.randint(1, 3)):
        data = rng.choice(MUTATORS)(data, rng)
    return data


# --- the readers under test ------------------------------------------------------------


def _read_colmap(folder: Path) -> None:
    model = colmap.read_model(folder)
    for camera in model.cameras.values():
        if camera.model in colmap.SUPPORTED_MODELS:
            colmap.intrinsics(camera)
    for image in model.images:
        colmap.world_to_cam(image)


def _read_transforms(folder: Path) -> None:
    """What load.py does with a transforms.json: its frames, then the point cloud it names."""
    frames, ply = read_nerfstudio(folder)
    if ply is not None and is_file(ply):
        read_ply_points(ply)


READERS: Dict[str, Callable[[Path], object]] = {
    "colmap_bin": _read_colmap,
    "colmap_txt": _read_colmap,
    "transforms": _read_transforms,
    "transforms_synthetic": lambda folder: read_nerf_synthetic(folder, "train"),
    "ply": lambda folder: read_ply(folder / "model.ply"),
    "points_ply": lambda folder: read_ply_points(folder / "points.ply"),
}


def prepare(seeds: Dict[str, Dict[str, bytes]], reader: str, folder: Path, file_name: str, data: bytes) -> None:
    """Write the reader's valid files into `folder`, with `file_name` replaced by `data`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, valid in seeds[reader].items():
        (folder / name).write_bytes(data if name == file_name else valid)
    if reader == "transforms":  # the point cloud it names, so that its reader runs too
        (folder / "points.ply").write_bytes(seeds["points_ply"]["points.ply"])


def run_one(reader: str, folder: Path) -> Tuple[str, str]:
    """('ok' | 'error' | 'other', traceback text for 'other')."""
    try:
        READERS[reader](folder)
    except TurboGSError:
        return "error", ""
    except Exception:  # noqa: BLE001 - counting exactly these is the point
        return "other", traceback.format_exc()
    return "ok", ""


# --- the long run ------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=10000, help="mutated inputs per reader (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readers", nargs="+", choices=sorted(READERS), default=list(READERS))
    parser.add_argument("--show", type=int, default=3, help="tracebacks printed per reader (default 3)")
    args = parser.parse_args()

    import warnings

    warnings.simplefilter("ignore")  # numpy overflow warnings on extreme values are expected
    root = Path(tempfile.mkdtemp(prefix="turbogs_fuzz_"))
    try:
        seeds = write_seeds(root / "seeds")
        print("| reader | examples | loaded | TurboGSError | other | seconds |")
        print("|---|---|---|---|---|---|")
        for reader in args.readers:
            rng = random.Random(f"{args.seed}-{reader}")
            counts = {"ok": 0, "error": 0, "other": 0}
            shown: List[str] = []
            started = time.perf_counter()
            for i in range(args.examples):
                file_name = rng.choice(sorted(seeds[reader]))
                data = mutate(seeds[reader][file_name], rng)
                folder = root / "case"
                shutil.rmtree(folder, ignore_errors=True)
                prepare(seeds, reader, folder, file_name, data)
                outcome, text = run_one(reader, folder)
                counts[outcome] += 1
                if outcome == "other" and len(shown) < args.show:
                    shown.append(f"--- {reader} example {i} ({file_name}, {len(data)} bytes) ---\n{text}")
            seconds = time.perf_counter() - started
            print(f"| {reader} | {args.examples} | {counts['ok']} | {counts['error']} | {counts['other']} | "
                  f"{seconds:.0f} |", flush=True)
            for text in shown:
                print(text, flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
