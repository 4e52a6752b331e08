"""--antialiased by the Mip-Splatting protocol (issue 32): train at one resolution, test at
1, 1/2, 1/4 and 1/8 of it, with and without the 2D filter's opacity compensation.

    python benchmarks/antialias.py --scene demo=scenes/demo \
        --scene synthetic=/tmp/captures/synthetic:init_random_points=3000 \
        --scene test_colmap=$DATA/test_colmap:r=8 --steps 800 --seeds 0 1 --out /tmp/aa_bench

Each run is the turbo preset for a fixed number of steps (so both modes train the same steps).
The test views at scale 1/s are the same cameras with the images area-downsampled (INTER_AREA,
as the loader shrinks every image) and the intrinsics scaled, as Mip-Splatting's
multi-scale test; the model renders them in its own mode (classic, or the antialiased mode its
cfg_args records). An antialiased model is also rendered without the compensation: what a
classic renderer (SIBR, most web viewers) shows of it. Prints one row per run and scale, and per
capture the mean PSNR of each mode at each scale with the difference, seed by seed. `--reuse`
evaluates the models a previous run left in --out instead of training them again.

A scene is `NAME=PATH[:r=R][:w][:FIELD=VALUE ...]` (turbogs/bench/scenes.py: the form every
benchmark takes), its settings for its own runs; `--set FIELD=VALUE` is a setting for every run,
as `turbogs bench --set` (turbogs/bench/settings.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import Sequence

import torch

from turbogs.bench.scenes import SceneSpec, scene_arg
from turbogs.bench.settings import apply_settings
from turbogs.device import pick_device
from turbogs.errors import InputError
from turbogs.formats.model_folder import load_gaussians
from turbogs.metrics import psnr
from turbogs.render import render
from turbogs.training.config import TrainConfig, get_preset
from turbogs.training.session import train
from turbogs.training.trainer import SessionOptions

SCALES = (1, 2, 4, 8)


def run_config(spec: SceneSpec, settings: Sequence[str]) -> TrainConfig:
    """Turbo with every run's --set settings, then the scene's own."""
    return apply_settings(get_preset("turbo"), [*settings, *spec.settings])


def test_resolution(spec: SceneSpec, train_width: int, scale: int):
    """The loader's resolution argument for the test views at 1/scale of the training size:
    the factor itself for a capture trained at full size, else a target width."""
    if scale == 1:
        return spec.resolution
    if spec.resolution is None:
        return scale
    return max(9, round(train_width / scale))


@torch.no_grad()
def scale_psnr(gaussians, scene, antialiased=None) -> float:
    """Mean test PSNR; `antialiased` None renders in the model's own mode."""
    background = scene.background(gaussians.means.device)
    values = [psnr(render(gaussians, camera, background=background, antialiased=antialiased).image.clamp(0, 1),
                   camera.image) for camera in scene.test]
    return float(sum(values) / len(values))


def run_one(spec: SceneSpec, antialiased: bool, seed: int, steps: int, out: Path, reuse: bool = False,
            settings: Sequence[str] = ()) -> list:
    cfg = run_config(spec, settings)
    cfg.seed, cfg.antialiased = seed, antialiased
    cfg = cfg.for_run(steps, None)
    scene = spec.load(eval_split=True, log=lambda *_: None)
    folder = out / f"{spec.label}_{'aa' if antialiased else 'classic'}_s{seed}"
    if not (reuse and (folder / "results.json").is_file()):
        if folder.exists():
            shutil.rmtree(folder)
        options = SessionOptions(out_dir=folder, device=pick_device("cpu", 1), progress=False, eval_split=True,
                             save_test_images=False, resolution=spec.resolution or -1, log=lambda *_: None)
        train(scene, cfg, options)
    gaussians, _ = load_gaussians(folder, "cpu")
    assert gaussians.antialiased == antialiased  # the model folder recorded the mode
    rows = []
    for scale in SCALES:
        test = spec.load(resolution=test_resolution(spec, scene.train[0].width, scale), eval_split=True,
                         log=lambda *_: None)
        row = {"scene": spec.label, "antialiased": antialiased, "seed": seed, "scale": scale,
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
    p.add_argument("--scene", action="append", required=True, type=scene_arg,
                   help="NAME=PATH[:r=R][:w][:FIELD=VALUE ...] (repeatable)")
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/aa_bench"))
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="FIELD=VALUE",
                   help="a turbo setting for every run, as turbogs bench --set, e.g. density.opacity_decay=0.8")
    p.add_argument("--reuse", action="store_true", help="evaluate the models already in --out, train only missing ones")
    args = p.parse_args(argv)
    for spec in args.scene:  # a setting that does not apply is one line now, not after the first runs
        try:
            run_config(spec, args.settings)
        except InputError as error:
            p.error(str(error))
    torch.set_num_threads(1)
    rows = []
    for spec in args.scene:
        for seed in args.seeds:
            for antialiased in (False, True):
                rows += run_one(spec, antialiased, seed, args.steps, args.out, args.reuse, args.settings)
    print(summarize(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
