"""--antialiased by the Mip-Splatting protocol (issue 32): train at one resolution, test at
1, 1/2, 1/4 and 1/8 of it, with and without the 2D filter's opacity compensation.

    python benchmarks/antialias.py --scene demo=scenes/demo \
        --scene synthetic=/tmp/captures/synthetic --scene test_colmap=$DATA/test_colmap:r=8 \
        --steps 800 --seeds 0 1 --out /tmp/aa_bench

Each run is the turbo preset for a fixed number of steps (so both modes train the same steps).
The test views at scale 1/s are the same cameras with the images area-downsampled (INTER_AREA,
as the loader shrinks every image) and the intrinsics scaled, as Mip-Splatting's
multi-scale test; the model renders them in its own mode (classic, or the antialiased mode its
cfg_args records). An antialiased model is also rendered without the compensation: what a
classic renderer (SIBR, most web viewers) shows of it. Prints one row per run and scale, and per
capture the mean PSNR of each mode at each scale with the difference, seed by seed. `--reuse`
evaluates the models a previous run left in --out instead of training them again.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import torch

from turbogs.data.load import load_scene
from turbogs.device import pick_device
from turbogs.formats.model_folder import load_gaussians
from turbogs.metrics import psnr
from turbogs.render import render
from turbogs.training.config import get_preset
from turbogs.training.run import train
from turbogs.training.trainer import RunOptions

sys.path.insert(0, str(Path(__file__).resolve().parent))
from config_settings import apply_settings  # noqa: E402

SCALES = (1, 2, 4, 8)


def parse_scene(text: str) -> dict:
    """NAME=PATH[:r=R][:init=N]"""
    name, rest = text.split("=", 1)
    path, *options = rest.split(":")
    spec = {"name": name, "path": path, "r": None, "init": None}
    for option in options:
        key, value = option.split("=")
        spec[key] = int(value)
    return spec


def test_resolution(spec: dict, train_width: int, scale: int):
    """The loader's resolution argument for the test views at 1/scale of the training size:
    the factor itself for a capture trained at full size, else a target width."""
    if scale == 1:
        return spec["r"]
    if spec["r"] is None:
        return scale
    return max(9, round(train_width / scale))


@torch.no_grad()
def scale_psnr(gaussians, scene, antialiased=None) -> float:
    """Mean test PSNR; `antialiased` None renders in the model's own mode."""
    background = scene.background(gaussians.means.device)
    values = [psnr(render(gaussians, camera, background=background, antialiased=antialiased).image.clamp(0, 1),
                   camera.image) for camera in scene.test]
    return float(sum(values) / len(values))


def run_one(spec: dict, antialiased: bool, seed: int, steps: int, out: Path, reuse: bool = False,
            settings=()) -> list:
    cfg = apply_settings(get_preset("turbo"), settings)
    cfg.seed, cfg.antialiased = seed, antialiased
    if spec["init"]:
        cfg.init_random_points = spec["init"]
    cfg = cfg.for_run(steps, None)
    scene = load_scene(spec["path"], resolution=spec["r"], eval_split=True, log=lambda *_: None)
    folder = out / f"{spec['name']}_{'aa' if antialiased else 'classic'}_s{seed}"
    if not (reuse and (folder / "results.json").is_file()):
        if folder.exists():
            shutil.rmtree(folder)
        options = RunOptions(out_dir=folder, device=pick_device("cpu", 1), progress=False, eval_split=True,
                             save_test_images=False, resolution=spec["r"] or -1, log=lambda *_: None)
        train(scene, cfg, options)
    gaussians, _ = load_gaussians(folder, "cpu")
    assert gaussians.antialiased == antialiased  # the model folder recorded the mode
    rows = []
    for scale in SCALES:
        test = load_scene(spec["path"], resolution=test_resolution(spec, scene.train[0].width, scale),
                          eval_split=True, log=lambda *_: None)
        row = {"scene": spec["name"], "antialiased": antialiased, "seed": seed, "scale": scale,
               "width": test.test[0].width, "psnr": scale_psnr(gaussians, test)}
        if antialiased:
            row["psnr_classic_renderer"] = scale_psnr(gaussians, test, antialiased=False)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def summarize(rows: list) -> str:
    lines = ["| capture | scale (width) | classic PSNR | antialiased PSNR | gain, per seed | "
             "antialiased model in a classic renderer |", "|---|---|---|---|---|---|"]
    for scene in dict.fromkeys(r["scene"] for r in rows):
        for scale in SCALES:
            runs = {(r["antialiased"], r["seed"]): r for r in rows if r["scene"] == scene and r["scale"] == scale}
            seeds = sorted({seed for _, seed in runs})
            classic = [runs[(False, s)]["psnr"] for s in seeds]
            aa = [runs[(True, s)]["psnr"] for s in seeds]
            gains = [a - c for a, c in zip(aa, classic)]
            shown = [runs[(True, s)]["psnr_classic_renderer"] for s in seeds]
            width = runs[(False, seeds[0])]["width"]
            lines.append(f"| {scene} | 1/{scale} ({width} px) | {statistics.mean(classic):.2f} | "
                         f"{statistics.mean(aa):.2f} | **{statistics.mean(gains):+.2f}** "
                         f"({', '.join(f'{g:+.2f}' for g in gains)}) | {statistics.mean(shown):.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scene", action="append", required=True, help="NAME=PATH[:r=R][:init=N]")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/aa_bench"))
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE",
                   help="a turbo setting for every run (config_settings.py), e.g. density.opacity_decay=0.8")
    p.add_argument("--reuse", action="store_true", help="evaluate the models already in --out, train only missing ones")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for spec in map(parse_scene, args.scene):
        for seed in args.seeds:
            for antialiased in (False, True):
                rows += run_one(spec, antialiased, seed, args.steps, args.out, args.reuse, args.settings)
    print(summarize(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
