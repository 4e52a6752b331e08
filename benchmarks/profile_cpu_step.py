"""torch.profiler's costliest ops of whole CPU training steps (issue 30: profile first).

Builds a Trainer on a capture with its points dropped, so that it starts from exactly
--counts Gaussians along the camera rays, moves it to the step where the preset renders
what it renders at --progress (turbo: every tile before 20 %, a quarter from 60 %), runs a
few untimed steps and profiles a few more. Everything the trainer does in a step is in
the table: sampling, render, loss, backward, optimizer, density control.

    python benchmarks/profile_cpu_step.py [--scene scenes/demo] [-r 1] [--counts 10000 100000]
        [--presets turbo 3dgs] [--progress 0.1 0.7] [--threads 1] [--steps 3]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
from torch.profiler import ProfilerActivity, profile

from turbogs.data.load import load_scene
from turbogs.training.config import get_preset
from turbogs.training.trainer import RunOptions, Trainer

RUN_STEPS = 1000  # the schedules' length; --progress places the profiled steps in it


def make_trainer(scene, preset: str, count: int, progress: float, out_dir: Path, seed: int = 0) -> Trainer:
    """A trainer of `preset` starting from `count` ray points, at step progress * RUN_STEPS."""
    cfg = get_preset(preset)
    cfg.seed = seed
    cfg.init_random_points = count
    cfg = cfg.for_run(steps=RUN_STEPS)
    trainer = Trainer(scene, cfg, RunOptions(out_dir=out_dir, evaluate=False, progress=False, log=lambda *_: None))
    trainer.step = int(progress * RUN_STEPS)
    return trainer


def load_pointless(scene_dir: str, resolution):
    """The capture without its points, so that --init-points sets the count."""
    scene = load_scene(scene_dir, resolution=resolution, eval_split=True, log=lambda *_: None)
    scene.points = None
    scene.point_colors = None
    return scene


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", default="scenes/demo")
    parser.add_argument("-r", "--resolution", type=int, default=None)
    parser.add_argument("--counts", type=int, nargs="+", default=[10000])
    parser.add_argument("--presets", nargs="+", default=["turbo", "3dgs"])
    parser.add_argument("--progress", type=float, nargs="+", default=[0.1])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from turbogs import kernels

    scene = load_pointless(args.scene, args.resolution)
    camera = scene.train[0]
    print(f"{args.scene} -r {args.resolution}: {camera.width}x{camera.height} px, {args.threads} thread(s), "
          f"backend {kernels.backend_name(torch.device('cpu'))}, torch {torch.__version__}")
    with TemporaryDirectory() as tmp:
        for count in args.counts:
            for preset in args.presets:
                for progress in args.progress:
                    trainer = make_trainer(scene, preset, count, progress, Path(tmp) / "out")
                    for _ in range(2):
                        trainer.run_step()
                    started = time.perf_counter()
                    with profile(activities=[ProfilerActivity.CPU]) as prof:
                        for _ in range(args.steps):
                            trainer.run_step()
                    seconds = (time.perf_counter() - started) / args.steps
                    print(f"\n== {preset}, {count} Gaussians at the start ({len(trainer.gaussians)} now), "
                          f"step {trainer.step} of {RUN_STEPS}: {seconds * 1e3:.0f} ms a step under the profiler, "
                          f"{args.steps} steps")
                    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
                    del trainer


if __name__ == "__main__":
    main()
