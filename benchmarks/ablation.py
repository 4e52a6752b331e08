"""Train one preset on a capture with config overrides, and print test PSNR at 1/4, 1/2,
3/4 and all of the steps: the quick instrument behind the ablation notes in results/.

    python benchmarks/ablation.py NAME PRESET STEPS [field.sub=value ...] [--scene DIR] [-r R]

Example: python benchmarks/ablation.py hybrid turbo 300 optimizer=hybrid optimizer.selective=false
(`density=NAME` / `optimizer=NAME` swap in that part at its defaults; later overrides edit it.)
"""

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path

import torch

from turbogs.data.load import load_scene
from turbogs.evaluate import evaluate_views
from turbogs.training.config import DENSITY_CONFIGS, OPTIMIZER_CONFIGS, get_preset
from turbogs.training.trainer import RunOptions, Trainer

REPO = Path(__file__).resolve().parents[1]


def parse_value(current, text: str):
    if isinstance(current, bool):
        if text.lower() not in ("true", "false"):
            raise ValueError(f"expected true or false, got {text}")
        return text.lower() == "true"
    if isinstance(current, tuple):
        return tuple(part for part in text.split(",") if part)
    return float(text) if current is None else type(current)(text)


def apply_override(cfg, assignment: str) -> None:
    key, text = assignment.split("=", 1)
    *path, field = key.split(".")
    kinds = {"density": DENSITY_CONFIGS, "optimizer": OPTIMIZER_CONFIGS}
    if not path and field in kinds:
        if text not in kinds[field]:
            raise KeyError(f"no {field} named {text} (choose from {', '.join(kinds[field])})")
        setattr(cfg, field, kinds[field][text]())
        return
    target = cfg
    for part in path:
        target = getattr(target, part)
    if not dataclasses.is_dataclass(target) or not hasattr(target, field):
        raise KeyError(f"no config field {key}")
    setattr(target, field, parse_value(getattr(target, field), text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name")
    parser.add_argument("preset")
    parser.add_argument("steps", type=int)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--scene", default=str(REPO / "scenes" / "demo"))
    parser.add_argument("-r", "--resolution", type=int, help="downscale factor, as turbogs train -r")
    args = parser.parse_args()
    torch.set_num_threads(1)

    scene = load_scene(args.scene, resolution=args.resolution, eval_split=True, log=lambda *_: None)
    cfg = get_preset(args.preset)
    for assignment in args.overrides:
        apply_override(cfg, assignment)
    cfg = cfg.for_run(steps=args.steps)
    marks = {args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps}
    points = []
    with tempfile.TemporaryDirectory() as out:
        trainer = Trainer(scene, cfg, RunOptions(out_dir=Path(out), progress=False, log=lambda *_: None))
        while trainer.progress() < 1.0:
            trainer.run_step()
            if trainer.step in marks:
                psnr = evaluate_views(trainer.gaussians, scene.test, trainer.background, lpips_note=False)["mean"]["psnr"]
                points.append({"step": trainer.step, "train_seconds": round(trainer.elapsed, 1),
                               "test_psnr": round(psnr, 2), "num_gaussians": len(trainer.gaussians)})
    print(json.dumps({"name": args.name, "preset": args.preset, "overrides": args.overrides, "points": points}))


if __name__ == "__main__":
    main()
