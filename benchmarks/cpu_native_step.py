"""Seconds per whole CPU training step, native kernels against the torch twins, side by side
in one process (issue 30's "Must show").

For each Gaussian count and each step kind (turbo at 10 % of a 1000-step run: every tile;
turbo at 70 %: a quarter of the tiles; 3dgs: every tile), one trainer per (backend, threads)
starts from the same ray points with the same seed. After --warmup untimed steps each, the
trainers take turns one step at a time for --repeats rounds, so that a change in the
machine's load hits every configuration alike; the median of each is printed, then the
ratios: twins / native (1 thread), native 1 thread / 2 threads, and a sparse step / a full
one. A step is everything the trainer does (Trainer.timed_step), at the requested size (coarse to
fine off). With --model, the trainers start from that trained model's Gaussians cloned to each
count (bench/step_trainer.py), whose sizes are a real model's: the ray points' are several times
larger, so they reach more tiles, and a sparse step can cull fewer of them.

    python benchmarks/cpu_native_step.py [--scene ../shared/data/test_colmap] [-r 4]
        [--model MODEL_DIR] [--counts 10000 100000] [--repeats 5] [--threads 1 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from turbogs import kernels
from turbogs.bench.race import cpu_model_name
from turbogs.bench.step_trainer import trainer_at, without_points
from turbogs.data.load import load_scene
from turbogs.device import keep_freed_memory
from turbogs.formats.model_folder import load_gaussians
from turbogs.training.config import get_preset

KINDS = {"turbo full": ("turbo", 0.1), "turbo 25%": ("turbo", 0.7), "3dgs full": ("3dgs", 0.1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", default="scenes/demo")
    parser.add_argument("-r", "--resolution", type=int, default=None)
    parser.add_argument("--model", default=None, help="a model folder trained on the scene: start from its Gaussians")
    parser.add_argument("--counts", type=int, nargs="+", default=[10000])
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--twin-threads", type=int, nargs="*", default=[1],
                        help="thread counts to time the twins at (default 1: their ratio is taken at 1 thread; "
                             "none: native only)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    keep_freed_memory()  # as every CPU command does (turbogs/device.py): no page faults a step

    scene = without_points(load_scene(args.scene, resolution=args.resolution, eval_split=True, log=lambda *_: None))
    start = None if args.model is None else load_gaussians(Path(args.model), torch.device("cpu"))[0]
    camera = scene.train[0]
    kernels.use_torch_twins(False)
    if kernels.backend_name(torch.device("cpu")) != "cpu-native":
        raise SystemExit("the native CPU kernels could not be built here: nothing to compare")
    print(f"{args.scene} -r {args.resolution}: {camera.width}x{camera.height} px, "
          f"{'from ' + args.model + ', ' if start is not None else 'from ray points, '}torch {torch.__version__}, "
          f"CPU: {cpu_model_name()}, "
          f"{args.repeats} timed steps per configuration (median), turns taken step by step")
    configs = [("native", t) for t in args.threads] + [("twins", t) for t in args.twin_threads]
    with TemporaryDirectory() as tmp:
        for count in args.counts:
            medians = {}
            for kind in args.kinds:
                preset, progress = KINDS[kind]
                trainers = {}
                for backend, threads in configs:
                    torch.set_num_threads(threads)
                    kernels.use_torch_twins(backend == "twins")
                    trainer = trainer_at(scene, get_preset(preset), count, progress,
                                         Path(tmp) / f"{kind}-{backend}-{threads}", start=start)
                    for _ in range(args.warmup):
                        trainer.timed_step()
                    trainers[backend, threads] = trainer
                times = {key: [] for key in trainers}
                for _ in range(args.repeats):
                    for (backend, threads), trainer in trainers.items():
                        torch.set_num_threads(threads)
                        kernels.use_torch_twins(backend == "twins")
                        started = time.perf_counter()
                        trainer.timed_step()
                        times[backend, threads].append(time.perf_counter() - started)
                for key, values in times.items():
                    medians[(kind, *key)] = statistics.median(values)
                    print(f"{count:>7} Gaussians  {kind:<10} {key[0]:<6} {key[1]} thread(s): "
                          f"{medians[(kind, *key)] * 1e3:8.1f} ms a step   (all: "
                          + " ".join(f"{v * 1e3:.0f}" for v in values) + ")", flush=True)
                del trainers
            kernels.use_torch_twins(False)
            print(f"-- ratios at {count} Gaussians")
            for kind in args.kinds:
                if (kind, "twins", 1) in medians and (kind, "native", 1) in medians:
                    print(f"   {kind:<10} twins / native, 1 thread:       "
                          f"{medians[kind, 'twins', 1] / medians[kind, 'native', 1]:6.2f}x")
                if (kind, "native", 2) in medians and (kind, "native", 1) in medians:
                    print(f"   {kind:<10} native 1 thread / 2 threads:    "
                          f"{medians[kind, 'native', 1] / medians[kind, 'native', 2]:6.2f}x")
            for backend, threads in configs:
                if ("turbo 25%", backend, threads) in medians and ("turbo full", backend, threads) in medians:
                    print(f"   turbo 25% / full step, {backend} {threads} thread(s): "
                          f"{medians['turbo 25%', backend, threads] / medians['turbo full', backend, threads]:6.2f}")


if __name__ == "__main__":
    main()
