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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scene", type=Path,
                        help="a capture with known poses: images/ and sparse/ (COLMAP) or transforms.json (the shipped side)")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("-r", "--resolution", type=int, default=8)
    parser.add_argument("--preset", default="turbo")
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    shipped_kind = shipped_poses(args.scene)
    root = args.out or Path(tempfile.mkdtemp(prefix="sfm_vs_shipped_"))
    ours = root / "ours"
    shutil.rmtree(ours, ignore_errors=True)
    shutil.copytree(args.scene / "images", ours / "images")
    start = time.perf_counter()
    sfm_out = turbogs("sfm", ours, "--quiet")
    sfm_seconds = time.perf_counter() - start
    stats = json.loads((ours / "sparse" / "0" / "turbogs_sfm.json").read_text())
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        shipped = train(args.scene, root / f"shipped_seed{seed}", args, seed)
        found = train(ours, root / f"ours_seed{seed}", args, seed)
        rows.append((seed, shipped, found))
    print(f"# Our SfM against the shipped {shipped_kind}: {args.scene.name}\n")
    print(f"command: python benchmarks/sfm_vs_shipped.py {args.scene} --steps {args.steps} -r {args.resolution} "
          f"--preset {args.preset} --seeds {args.seeds}\n")
    print(next((line for line in sfm_out.splitlines() if line.startswith("SfM:")), "SfM: ?"))
    print(f"SfM wall time (turbogs sfm, whole command): {sfm_seconds:.1f} s; registered {stats['registered']} of "
          f"{stats['total_images']}" + ("" if stats["registered"] == stats["total_images"]
                                        else " (the test splits differ: photos left out)") + "\n")
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
