"""The `turbogs bench` subcommand: its flags and what it prints."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from turbogs import kernels
from turbogs.bench.audit import run_step_audit
from turbogs.bench.report import PSNR_TOLERANCE_DB
from turbogs.bench.race import BenchSettings, parse_presets, race_presets
from turbogs.bench.scenes import parse_scene_spec
from turbogs.bench.step_cost import run_step_cost
from turbogs.cli.args import add_device, add_torch_twins, positive_float, positive_int, resolution_arg
from turbogs.device import pick_device
from turbogs.errors import InputError
from turbogs.training.config import ABLATIONS, PRESETS


def add_parser(subcommands) -> None:
    p = subcommands.add_parser(
        "bench", help="train presets side by side and compare their time to quality",
        description="Train each preset on the same scene and split, evaluate the test views at fixed points of "
                    "training time, and write bench.json, bench.md and psnr_vs_time.png.")
    p.add_argument("scene", help="capture folder (COLMAP or transforms.json); every 8th image is a test view. "
                                 "Also the benchmarks' scene form PATH[:r=R][:w] (as -r R, -w)")
    p.add_argument("--presets", default=",".join(PRESETS),
                   help=f"comma-separated presets to compare, run in this order (default: {','.join(PRESETS)}); "
                        f"PRESET+ABLATION switches one part off, e.g. turbo+no-ncc "
                        f"(ablations: {', '.join(ABLATIONS)}); PRESET@N runs N steps whatever the "
                        f"budget, e.g. turbo,3dgs@7000 races turbo's budget against 3dgs at 7k steps")
    sizing = p.add_mutually_exclusive_group()
    sizing.add_argument("--budget-seconds", type=positive_float, metavar="S",
                        help="give each preset a time budget of S seconds of training (as train --budget-seconds)")
    sizing.add_argument("--steps", type=positive_int, metavar="N",
                        help="train each preset for N steps, without a time budget (as train --steps)")
    p.add_argument("-r", "--resolution", type=resolution_arg,
                   help="downscale factor 1|2|4|8, or a target width in px (default: full size, capped at 1600 px)")
    p.add_argument("--images", default="images", help="image folder inside the capture (default: images)")
    p.add_argument("--white-background", "-w", action="store_true", help="composite RGBA images on white")
    add_device(p)
    add_torch_twins(p)
    p.add_argument("--seed", type=int, default=0, help="random seed, the same for every preset (default 0)")
    p.add_argument("--set", dest="config_settings", action="append", default=[], metavar="FIELD=VALUE",
                   help="set a training setting on every preset before the run is sized (repeatable, in order): "
                        "dotted paths reach into parts (density.opacity_decay=0.6, coarse_to_fine.target_steps=2000), "
                        "values are Python literals; density=NAME / optimizer=NAME swap that part at its defaults. "
                        "Recorded in bench.json and bench.md")
    p.add_argument("--eval-points", type=positive_int, default=8,
                   help="evaluations on the test views during each run, evenly spaced (default 8)")
    p.add_argument("--out", "-o", required=True, help="folder for bench.json, bench.md and psnr_vs_time.png")
    p.add_argument("--step-cost", action="store_true",
                   help="instead: seconds per render+loss+backward at 100%%, 50%% and 25%% of tiles (step_cost.json)")
    p.add_argument("--step-cost-repeats", type=positive_int, default=7, help="repeats per fraction (default 7)")
    p.add_argument("--step-cost-gaussians", type=positive_int, metavar="N",
                   help="with --step-cost: clone the initial Gaussians up to N (default: the initial ones)")
    p.add_argument("--step-cost-profile", action="store_true",
                   help="with --step-cost: also write torch.profiler's costliest ops to profile.txt")
    p.add_argument("--step-audit", action="store_true",
                   help="instead: count host reads and aten ops per training step of the trainer's own code, "
                        "outside render and backward (step_audit.json); --steps N: steps counted (default 100)")
    p.add_argument("--batch-views", type=positive_int, default=1, metavar="B",
                   help="views per optimizer step, as turbogs train --batch-views (default 1)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    argv = args.argv
    if args.step_cost and args.step_audit:
        raise InputError("bench: --step-cost and --step-audit are separate measurements; give one")
    if args.step_audit and args.budget_seconds is not None:
        raise InputError("bench: --step-audit counts steps; use --steps N, not --budget-seconds")
    audit_steps = args.steps if args.step_audit else None
    if args.step_audit:
        args.steps = None
    if args.step_cost and (args.steps is not None or args.budget_seconds is not None):
        raise InputError("bench: --step-cost measures single steps; drop --steps / --budget-seconds")
    kernels.use_torch_twins(args.torch_twins)
    scene = parse_scene_spec(args.scene)
    if scene.settings:
        raise InputError(f"bench: give settings with --set, not in the scene ({', '.join(scene.settings)})")
    if None not in (scene.resolution, args.resolution) and scene.resolution != args.resolution:
        raise InputError(f"bench: the scene says r={scene.resolution} and -r says {args.resolution}; give one")
    settings = BenchSettings(
        scene=scene.path, presets=parse_presets(args.presets), out_dir=Path(args.out),
        steps=args.steps, budget_seconds=args.budget_seconds,
        resolution=scene.resolution if args.resolution is None else args.resolution, images=args.images,
        white_background=args.white_background or scene.white_background,
        device=pick_device(args.device, args.threads), seed=args.seed, batch_views=args.batch_views,
        eval_points=args.eval_points, progress=not args.quiet,
        command="turbogs " + shlex.join(argv), config_settings=tuple(args.config_settings),
        scene_name=scene.name,
    )
    if args.step_audit:
        run_step_audit(settings, steps=audit_steps)
        return 0
    if args.step_cost:
        run_step_cost(settings, repeats=args.step_cost_repeats, num_gaussians=args.step_cost_gaussians,
                      profile=args.step_cost_profile)
        return 0
    result = race_presets(settings)
    for name, entry in result["presets"].items():
        final = entry["points"][-1]
        print(f"{name}: PSNR {final['psnr']:.2f} dB, SSIM {final['ssim']:.4f} after {entry['train_seconds']:.1f} s "
              f"({entry['steps']} steps, {entry['steps_per_second']} steps/s), {entry['num_gaussians']} Gaussians")
    for a, row in result["speedup"].items():
        for b, s in row.items():
            if s is None:
                continue
            target = f"{b}'s final {s['target_psnr']:.2f} dB (within {PSNR_TOLERANCE_DB} dB)"
            if s["seconds"] is None:
                print(f"{a} never reached {target}")
            elif s["speedup"] is None:
                print(f"{a} and {b} were both there at the start: {target}")
            else:
                print(f"{a} reached {target} in {s['seconds']:.1f} s, {b} first in {s['reference_seconds']:.1f} s "
                      f"({s['speedup']:.2f}x) of its {s['reference_run_seconds']:.1f} s ({s['speedup_vs_run']:.2f}x)")
    print(f"wrote {settings.out_dir / 'bench.json'}, bench.md and psnr_vs_time.png")
    return 0
