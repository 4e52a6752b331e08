"""One training run with any config field changed, in-process: test PSNR, and the Gaussian count
over the run and at each densification (to see what density control does).

    python benchmarks/config_variants.py CAPTURE turbo 1000 density.opacity_decay=0.6 density.opacity_decay_from=0.2
    python benchmarks/config_variants.py scenes/demo turbo 1500 seed=1
    python benchmarks/config_variants.py CAPTURE turbo 1000 density=3dgs      # another strategy at its defaults

CAPTURE[:rN][:w]: downscale N, white background (a NeRF-synthetic capture uses its test split,
others every 8th view). FIELD=VALUE sets a TrainConfig field before the run is sized (dotted
paths reach into its parts; values are Python literals); `seed=`, `density=NAME` and
`optimizer=NAME` are shortcuts. The steps are a step count, or `budget:S` for a time budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from config_settings import apply_settings  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("capture", help="CAPTURE[:rN][:w]")
    parser.add_argument("preset")
    parser.add_argument("length", help="steps, or budget:SECONDS")
    parser.add_argument("fields", nargs="*", help="FIELD=VALUE settings")
    args = parser.parse_args()

    from turbogs.data.load import load_scene
    from turbogs.density import error_driven
    from turbogs.device import pick_device
    from turbogs.training import run
    from turbogs.training.config import get_preset
    from turbogs.training.trainer import RunOptions, Trainer

    path, *options = args.capture.split(":")
    resolution = next((int(o[1:]) for o in options if o.startswith("r")), None)
    cfg = get_preset(args.preset)
    try:
        apply_settings(cfg, args.fields)
    except KeyError as error:
        parser.error(error.args[0])
    if args.length.startswith("budget:"):
        cfg = cfg.for_run(None, float(args.length.split(":")[1]))
    else:
        cfg = cfg.for_run(int(args.length), None)
    scene = load_scene(path, resolution=resolution, eval_split=True, white_background="w" in options,
                       test_every=cfg.test_every, log=lambda message: None)

    counts = []
    densify = error_driven.ErrorDrivenDensity.densify_and_prune

    def logged_densify(self, state, gaussians, *rest, **named):
        before = len(gaussians)
        stats = densify(self, state, gaussians, *rest, **named)
        print(f"  densify: {before} -> {len(gaussians)}", {k: v for k, v in stats.items() if k.startswith("n_")})
        return stats

    error_driven.ErrorDrivenDensity.densify_and_prune = logged_densify
    step = Trainer.run_step

    def counted_step(self):
        seconds = step(self)
        if self.step % 100 == 0:
            counts.append((self.step, round(self.elapsed, 1), len(self.gaussians)))
        return seconds

    Trainer.run_step = counted_step
    with tempfile.TemporaryDirectory() as out:
        started = time.perf_counter()
        summary = run.train(scene, cfg, RunOptions(out_dir=Path(out), device=pick_device("cpu", 1), progress=False,
                                                   eval_split=True, log=lambda message: print(" ", message[:160])))
    print(json.dumps({k: summary.get(k) for k in ("psnr", "ssim", "num_gaussians", "steps", "train_seconds")}),
          f"wall {time.perf_counter() - started:.1f} s")
    print("(step, seconds, Gaussians):", counts)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
