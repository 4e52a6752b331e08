"""Our SfM against a capture's shipped poses: images registered, SfM time, and the test PSNR of
training on each, with the same split, preset, steps and seeds (side by side, with the gap).

    python benchmarks/sfm_vs_shipped.py PATH/test_colmap --steps 2000 -r 8 --seeds 0,1 [--out DIR]
    python benchmarks/sfm_vs_shipped.py PATH/fox --steps 2000 -r 8 --seeds 0,1   # instant-ngp's transforms.json

The shipped side is a COLMAP model (sparse/) or a `transforms.json` (instant-ngp / nerfstudio) beside
the photos' `images/` folder; a transforms.json without points starts its Gaussians on the camera
rays, while ours start from SfM's points: the comparison is the one a user faces, poses and all.

The photos are copied into a fresh folder with no model, `turbogs sfm` runs there (the command a
user runs), then `turbogs train --eval` runs on the shipped capture and on ours, alternating so
that the machine's load falls on both alike. Both use every 8th photo in name order as a test
view; when SfM leaves photos out, the splits differ and the table says so. Each side's test views
are scored in its own cameras (ours are SfM's, in its own frame), which is what a user gets.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def turbogs(*args) -> str:
    done = subprocess.run([sys.executable, "-m", "turbogs", *map(str, args)], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"turbogs {' '.join(map(str, args))} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def train(scene: Path, out: Path, args, seed: int) -> dict:
    extra = ["--images", "."] if not (scene / "images").is_dir() else []
    turbogs("train", scene, "--eval", "--steps", args.steps, "-r", args.resolution, "--preset", args.preset,
            "--seed", seed, "--out", out, "--quiet", *extra)
    return json.loads((out / "results.json").read_text())


def shipped_poses(scene: Path) -> str:
    """What the shipped side is: a COLMAP model, else a transforms.json (the loader's own order)."""
    if not (scene / "images").is_dir():
        raise SystemExit(f"{scene}: no images/ folder (the photos our SfM runs on)")
    if (scene / "sparse").is_dir():
        return "COLMAP model"
    if (scene / "transforms.json").is_file():
        return "transforms.json"
    raise SystemExit(f"{scene}: no shipped poses (sparse/ or transforms.json)")


def world_to_cams(scene: Path) -> dict:
    """{photo file name: 4x4 OpenCV world-to-camera} of a capture's poses, read by TurboGS's own readers."""
    from turbogs.data import colmap
    from turbogs.data.transforms import read_nerfstudio

    folder = colmap.find_model_folder(scene)
    if folder is not None:
        return {Path(im.name).name: np.asarray(colmap.world_to_cam(im), dtype=np.float64)
                for im in colmap.read_model(folder).images}
    frames, _ = read_nerfstudio(scene)
    return {Path(v.name).name: np.asarray(v.world_to_cam, dtype=np.float64) for v in frames.views}


def similarity(src: np.ndarray, dst: np.ndarray):
    """Scale s, rotation R, shift t minimising |s R src + t - dst|^2 (Umeyama 1991), for [N, 3] points."""
    mu_s, mu_d = src.mean(0), dst.mean(0)
    a, b = src - mu_s, dst - mu_d
    u, sig, vt = np.linalg.svd(b.T @ a / len(src))
    d = np.diag([1.0, 1.0, np.sign(np.linalg.det(u @ vt))])
    R = u @ d @ vt
    s = float(np.trace(np.diag(sig) @ d) / (a ** 2).sum(1).mean())
    return s, R, mu_d - s * R @ mu_s


def pose_agreement(ours: dict, shipped: dict) -> str:
    """Our cameras against the shipped ones, after the similarity that best maps our centres onto
    theirs (SfM's frame and scale are its own): centre error as a fraction of the shipped cameras'
    spread, and the angle between matching camera orientations."""
    names = sorted(set(ours) & set(shipped))
    if len(names) < 3:
        return f"pose agreement: {len(names)} photos in common, too few to align"
    centre = lambda w2c: -w2c[:3, :3].T @ w2c[:3, 3]  # noqa: E731
    src = np.stack([centre(ours[n]) for n in names])
    dst = np.stack([centre(shipped[n]) for n in names])
    s, R, t = similarity(src, dst)
    errors = np.linalg.norm(s * src @ R.T + t - dst, axis=1)
    spread = float(np.sqrt(((dst - dst.mean(0)) ** 2).sum(1).mean()))
    angles = []
    for n in names:  # camera-to-world rotations: ours carried into the shipped frame by R
        rel = shipped[n][:3, :3] @ R @ ours[n][:3, :3].T
        skew = np.array([rel[2, 1] - rel[1, 2], rel[0, 2] - rel[2, 0], rel[1, 0] - rel[0, 1]])
        angles.append(np.degrees(np.arctan2(np.linalg.norm(skew) / 2, (np.trace(rel) - 1) / 2)))  # exact near 0
    return (f"pose agreement over {len(names)} photos (similarity-aligned camera centres): centre error "
            f"median {np.median(errors) / spread:.2%}, max {errors.max() / spread:.2%} of the cameras' spread; "
            f"orientation error median {np.median(angles):.2f} deg, max {max(angles):.2f} deg")


def write_aligned_capture(scene: Path, ours: Path, dest: Path) -> str:
    """A control for a shipped transforms.json without points: the same photos and poses, plus our SfM
    points carried into the shipped frame by the similarity that aligns our cameras to theirs, named
    by ply_file_path. Training on it separates what the poses cost from what a start from points gives."""
    from plyfile import PlyData, PlyElement

    from turbogs.data import colmap

    shipped = world_to_cams(scene)
    found = world_to_cams(ours)
    names = sorted(set(found) & set(shipped))
    centre = lambda w2c: -w2c[:3, :3].T @ w2c[:3, 3]  # noqa: E731
    s, R, t = similarity(np.stack([centre(found[n]) for n in names]), np.stack([centre(shipped[n]) for n in names]))
    model = colmap.read_model(colmap.find_model_folder(ours))
    xyz = s * model.points.astype(np.float64) @ R.T + t
    dest.mkdir(parents=True, exist_ok=True)
    if not (dest / "images").exists():
        (dest / "images").symlink_to((scene / "images").resolve(), target_is_directory=True)
    vertex = np.empty(len(xyz), dtype=[("x", "f4"), ("y", "f4"), ("z", "f4"),
                                       ("red", "u1"), ("green", "u1"), ("blue", "u1")])
    vertex["x"], vertex["y"], vertex["z"] = xyz.T
    vertex["red"], vertex["green"], vertex["blue"] = model.colors.astype(np.uint8).T
    PlyData([PlyElement.describe(vertex, "vertex")]).write(str(dest / "sfm_points_aligned.ply"))
    data = json.loads((scene / "transforms.json").read_text())
    data["ply_file_path"] = "sfm_points_aligned.ply"
    (dest / "transforms.json").write_text(json.dumps(data, indent=1))
    return f"wrote {dest}: the shipped poses and {len(xyz)} of our points (scale {s:.4f} into their frame)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scene", type=Path,
                        help="a capture with known poses: images/ and sparse/ (COLMAP) or transforms.json (the shipped side)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("-r", "--resolution", type=int, default=8)
    parser.add_argument("--preset", default="turbo")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("--reuse-sfm", action="store_true",
                        help="keep the model a previous run left in OUT/ours (its phase times come from its "
                             "turbogs_sfm.json) and only train: for more seeds without paying for SfM again")
    parser.add_argument("--write-aligned-capture", type=Path, metavar="DIR",
                        help="only write DIR, a control capture (the shipped transforms.json poses and our SfM "
                             "points aligned into their frame) from the model in OUT/ours, then stop")
    args = parser.parse_args()
    shipped_kind = shipped_poses(args.scene)
    root = args.out or Path(tempfile.mkdtemp(prefix="sfm_vs_shipped_"))
    ours = root / "ours"
    if args.write_aligned_capture is not None:
        print(write_aligned_capture(args.scene, ours, args.write_aligned_capture))
        return
    if args.reuse_sfm and (ours / "sparse" / "0" / "turbogs_sfm.json").is_file():
        sfm_out, sfm_seconds = "SfM: reused from an earlier run (--reuse-sfm)", float("nan")
    else:
        shutil.rmtree(ours, ignore_errors=True)
        shutil.copytree(args.scene / "images", ours / "images")
        start = time.perf_counter()
        sfm_out = turbogs("sfm", ours, "--quiet")
        sfm_seconds = time.perf_counter() - start
    stats = json.loads((ours / "sparse" / "0" / "turbogs_sfm.json").read_text())
    agreement = pose_agreement(world_to_cams(ours), world_to_cams(args.scene))
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        shipped = train(args.scene, root / f"shipped_seed{seed}", args, seed)
        found = train(ours, root / f"ours_seed{seed}", args, seed)
        rows.append((seed, shipped, found))
    print(f"# Our SfM against the shipped {shipped_kind}: {args.scene.name}\n")
    print(f"command: python benchmarks/sfm_vs_shipped.py {args.scene} --steps {args.steps} -r {args.resolution} "
          f"--preset {args.preset} --seeds {args.seeds}" + (" --reuse-sfm" if args.reuse_sfm else "") + "\n")
    print(next((line for line in sfm_out.splitlines() if line.startswith("SfM:")), "SfM: ?"))
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in stats["seconds"].items())
    wall = "not timed (reused)" if sfm_seconds != sfm_seconds else f"{sfm_seconds:.1f} s"
    print(f"SfM wall time (turbogs sfm, whole command): {wall} ({phases}); registered {stats['registered']} of "
          f"{stats['total_images']}" + ("" if stats["registered"] == stats["total_images"]
                                        else " (the test splits differ: photos left out)"))
    print(agreement + "\n")
    print("| seed | shipped poses PSNR | our SfM PSNR | ours - shipped | shipped SSIM | ours SSIM |")
    print("|---:|---:|---:|---:|---:|---:|")
    for seed, shipped, found in rows:
        print(f"| {seed} | {shipped['psnr']:.2f} | {found['psnr']:.2f} | {found['psnr'] - shipped['psnr']:+.2f} | "
              f"{shipped['ssim']:.4f} | {found['ssim']:.4f} |")
    gaps = [found["psnr"] - shipped["psnr"] for _, shipped, found in rows]
    spread = f" (min {min(gaps):+.2f}, max {max(gaps):+.2f})" if len(gaps) > 1 else ""
    print(f"\nmean gap: {statistics.mean(gaps):+.2f} dB over {len(gaps)} seed(s){spread}; runs in {root}")


if __name__ == "__main__":
    main()
