"""3DGS-MCMC against error-driven and vanilla density control, at an equal Gaussian cap and an
equal time (issue 32): test PSNR, the final and peak count, the peak as a fraction of the cap.

    python benchmarks/density_mcmc.py --scene demo=scenes/demo:cap=6000 \
        --scene forward_points=/tmp/captures/forward_points:cap=5000 \
        --scene synthetic=/tmp/captures/synthetic:cap=8000:init=4000 \
        --budget-seconds 60 --seeds 0 1 --variants error mcmc 3dgs --out /tmp/mcmc_bench

Each run is the turbo preset with `--density VARIANT --max-gaussians CAP` for the same
wall-clock budget (one process at a time), or with `--steps N` for the same steps. A variant
`mcmc@G` is MCMC with grow_rate G (the paper's 0.05 reaches the cap only after
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

import torch

from turbogs.data.load import load_scene
from turbogs.device import pick_device
from turbogs.training.config import get_preset
from turbogs.training.run import train
from turbogs.training.trainer import RunOptions


def parse_scene(text: str) -> dict:
    """NAME=PATH[:cap=N][:init=N][:r=R]"""
    name, rest = text.split("=", 1)
    path, *options = rest.split(":")
    spec = {"name": name, "path": path, "cap": None, "init": None, "r": None}
    for option in options:
        key, value = option.split("=")
        spec[key] = int(value)
    return spec


def config_for(variant: str, spec: dict, seed: int, budget, steps=None):
    density, _, grow = variant.partition("@")
    cfg = get_preset(f"turbo+density-{density}")
    cfg.seed = seed
    if spec["cap"]:
        cfg.density.max_gaussians = spec["cap"]
    for setting in filter(None, grow.split(",")):  # "0.2" (grow_rate) or "field=value,..."
        name, _, value = setting.rpartition("=")
        setattr(cfg.density, name or "grow_rate", float(value))
    if spec["init"]:
        cfg.init_random_points = spec["init"]
    return cfg.for_run(steps, None if steps else budget)


def run_one(spec: dict, variant: str, seed: int, budget: float, out: Path, steps=None) -> dict:
    cfg = config_for(variant, spec, seed, budget, steps)
    scene = load_scene(spec["path"], resolution=spec["r"], eval_split=True, log=lambda *_: None)
    folder = out / f"{spec['name']}_{variant}_s{seed}"
    if folder.exists():
        shutil.rmtree(folder)
    options = RunOptions(out_dir=folder, device=pick_device("cpu", 1), progress=False, eval_split=True,
                         save_test_images=False, resolution=spec["r"] or -1, log=lambda *_: None)
    summary = train(scene, cfg, options)
    row = {"scene": spec["name"], "variant": variant, "seed": seed, "cap": cfg.density.max_gaussians,
           **{k: summary[k] for k in ("psnr", "ssim", "num_gaussians", "peak_gaussians", "steps", "train_seconds")}}
    row["peak_fraction"] = row["peak_gaussians"] / row["cap"]
    print(json.dumps(row), flush=True)
    return row


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
                f"{statistics.mean(r['peak_fraction'] for r in runs):.2f} | "
                f"{statistics.mean(r['steps'] for r in runs):.0f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scene", action="append", required=True, help="NAME=PATH[:cap=N][:init=N][:r=R]")
    p.add_argument("--budget-seconds", type=float, default=60.0)
    p.add_argument("--steps", type=int, help="equal steps instead of equal time (a step-based run, deterministic per seed)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--variants", nargs="+", default=["error", "mcmc", "3dgs"])
    p.add_argument("--out", type=Path, default=Path("/tmp/mcmc_bench"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for spec in map(parse_scene, args.scene):
        for seed in args.seeds:
            for variant in args.variants:
                rows.append(run_one(spec, variant, seed, args.budget_seconds, args.out, args.steps))
    print(summarize(rows, args.variants))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
