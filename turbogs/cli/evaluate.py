"""`turbogs eval MODEL`: render a model's test views and write results.json, per_view.json and PNGs."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from turbogs.cli.args import add_device
from turbogs.device import pick_device
from turbogs.errors import TurboGSError


def add_parser(subcommands) -> None:
    p = subcommands.add_parser("eval", help="evaluate a model on its capture's test views",
                       description="Render the test views and write results.json, per_view.json and PNGs.")
    p.add_argument("model", help="model folder written by `turbogs train`")
    p.add_argument("--source", help="capture folder (default: the one named in the model's cfg_args)")
    p.add_argument("--no-images", action="store_true", help="do not save the renders and ground truth as PNG")
    add_device(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from turbogs.evaluate import evaluate_views, metrics_line, write_evaluation
    from turbogs.formats import model_folder as model

    device = pick_device(args.device, args.threads)
    model_dir = Path(args.model)
    gaussians, step = model.load_gaussians(model_dir, device)
    # a model file (an export: x.spz) is judged with the cfg_args beside it; results go to x.spz_eval/
    scene = model.scene_for_model(model_dir if model_dir.is_dir() else model_dir.parent, args.source, eval_split=True)
    if not scene.test:
        raise TurboGSError(f"{model_dir}: the capture has no test views (train with --eval)")
    started = time.perf_counter()
    evaluation = evaluate_views(gaussians, scene.test, scene.background(device))
    if not model_dir.is_dir():
        model_dir = model_dir.parent / f"{model_dir.name}_eval"
        model_dir.mkdir(exist_ok=True)
    results = write_evaluation(model_dir, step or 0, evaluation,
                               {"num_gaussians": len(gaussians), "antialiased": gaussians.antialiased},
                               save_images=not args.no_images)
    print(f"{len(scene.test)} test views in {time.perf_counter() - started:.1f} s: {metrics_line(results)}")
    print(f"wrote {model_dir / 'results.json'} and {model_dir / 'per_view.json'}")
    return 0
