"""3DGS-MCMC against error-driven and vanilla density control, at an equal Gaussian cap and an
equal time (issue 32): test PSNR, the final and peak count, the peak as a fraction of the cap.

    python benchmarks/density_mcmc.py --scene demo=scenes/demo:density.max_gaussians=6000 \
        --scene forward_points=/tmp/captures/forward_points:density.max_gaussians=5000 \
        --scene synthetic=/tmp/captures/synthetic:density.max_gaussians=8000:init_random_points=4000 \
        --budget-seconds 60 --seeds 0 1 --variants error mcmc 3dgs --out /tmp/mcmc_bench

Each run is the turbo preset with `--density VARIANT` and the scene's cap for the same
wall-clock budget (one process at a time), or with `--steps N` for the same steps. A scene is
`NAME=PATH[:r=R][:w][:FIELD=VALUE ...]` (turbogs/bench/scenes.py), its settings applied after
the density is chosen: `density.max_gaussians=CAP` is the cap every variant of that scene gets.
A variant `mcmc@G` is MCMC with grow_rate G (the paper's 0.05 reaches the cap only after
log(cap / start) / log(1.05) refinements, which a short CPU run may not have); `mcmc@F=V,...`
sets any McmcDensityConfig field (e.g. `mcmc@noise_lr=0`). Prints one row per run and a
summary per capture and variant: the mean over the seeds, and its difference from
error-driven seed by seed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path
from typing import List, Tuple

import torch

from turbogs.bench.scenes import SceneSpec, scene_arg
from turbogs.bench.settings import apply_settings
from turbogs.device import pick_device
from turbogs.errors import TurboGSError
from turbogs.training.config import get_preset
from turbogs.training.session import train
from turbogs.training.trainer import SessionOptions


def variant_settings(variant: str) -> Tuple[str, List[str]]:
    """"mcmc@0.2" -> the density, ["density.grow_rate=0.2"]; "mcmc@noise_lr=0,..." -> each field."""
    density, _, fields = variant.partition("@")
    settings = [f"density.{item}" if "=" in item else f"density.grow_rate={item}" for item in fields.split(",") if item]
    return density, settings


def config_for(variant: str, spec: SceneSpec, seed: int, budget, steps=None):
    density, settings = variant_settings(variant)
    cfg = apply_settings(get_preset(f"turbo+density-{density}"), [*spec.settings, *settings])
    cfg.seed = seed
    return cfg.for_run(steps, None if steps else budget)


def run_one(spec: SceneSpec, variant: str, seed: int, budget: float, out: Path, steps=None) -> dict:
    cfg = config_for(variant, spec, seed, budget, steps)
    scene = spec.load(eval_split=True, log=lambda *_: None)
    folder = out / f"{spec.label}_{variant}_s{seed}"
    if folder.exists():
        shutil.rmtree(folder)
    options = SessionOptions(out_dir=folder, device=pick_device("cpu", 1), progress=False, eval_split=True,
                         save_test_images=False, resolution=spec.resolution or -1, log=lambda *_: None)
    summary = train(scene, cfg, options)
    row = {"scene": spec.label, "variant": variant, "seed": seed, "cap": cfg.density.max_gaussians,
           **{k: summary[k] for k in ("psnr", "ssim", "num_gaussians", "peak_gaussians", "steps", "train_seconds")}}
    row["peak_fraction"] = row["peak_gaussians"] / row["cap"] if row["cap"] else None
    print(json.dumps(row), flush=True)
    return row


def fraction(runs: list) -> str:
    """The mean peak / cap, "-" for a variant without a cap (vanilla density's default)."""
    shares = [r["peak_fraction"] for r in runs if r["peak_fraction"] is not None]
    return f"{statistics.mean(shares):.2f}" if shares else "-"


def summarize(rows: list, variants: list) -> str:
    lines = ["| capture | density | test PSNR (mean) | minus error-driven, per seed | final / peak Gaussians | "
             "peak / cap | steps |", "|---|---|---|---|---|---|---|"]
    for scene in dict.fromkeys(r["scene"] for r in rows):
        base = {r["seed"]: r["psnr"] for r in rows if r["scene"] == scene and r["variant"] == "error"}
        for variant in variants:
            runs = [r for r in rows if r["scene"] == scene and r["variant"] == variant]
            if not runs:
                continue
            diffs = [r["psnr"] - base[r["seed"]] for r in runs if r["seed"] in base]
            diff = "" if variant == "error" or not diffs else (
                f"{statistics.mean(diffs):+.2f} ({', '.join(f'{d:+.2f}' for d in diffs)})")
            lines.append(
                f"| {scene} | {variant} | {statistics.mean(r['psnr'] for r in runs):.2f} | {diff} | "
                f"{statistics.mean(r['num_gaussians'] for r in runs):.0f} / "
                f"{statistics.mean(r['peak_gaussians'] for r in runs):.0f} | "
                f"{fraction(runs)} | "
                f"{statistics.mean(r['steps'] for r in runs):.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scene", action="append", required=True, type=scene_arg,
                   help="NAME=PATH[:r=R][:w][:FIELD=VALUE ...], e.g. demo=scenes/demo:density.max_gaussians=6000")
    p.add_argument("--budget-seconds", type=float, default=60.0)
    p.add_argument("--steps", type=int, help="equal steps instead of equal time (a step-based run, deterministic per seed)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--variants", nargs="+", default=["error", "mcmc", "3dgs"])
    p.add_argument("--out", type=Path, default=Path("/tmp/mcmc_bench"))
    args = p.parse_args(argv)
    for spec in args.scene:  # a setting that does not apply is one line now, not after the first runs
        for variant in args.variants:
            try:
                config_for(variant, spec, 0, args.budget_seconds, args.steps)
            except TurboGSError as error:
                p.error(f"{spec.label}, {variant}: {error}")
    torch.set_num_threads(1)
    rows = []
    for spec in args.scene:
        for seed in args.seeds:
            for variant in args.variants:
                rows.append(run_one(spec, variant, seed, args.budget_seconds, args.out, args.steps))
    print(summarize(rows, args.variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
