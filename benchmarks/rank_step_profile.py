"""Where a step of 2 ranks goes on the CPU: each rank's own views, the one collective (its wait
for the slower rank included) and the rest of the step, against one process's step.

    python benchmarks/rank_step_profile.py --scene PATH [-r 4] [--views 800] [--warmup 200]

Each configuration trains turbo (coarse to fine off) from the same seed on --views views, one
process one view a step and 2 ranks one view each a step (half the steps: equal views, so the
same schedules and about the same Gaussian count), the first --warmup views untimed, with one
thread a rank (gloo on 127.0.0.1, the ranks spawned here). The collective is timed around
World.reduce_sum_and_max. A rank's wait for the other shows up inside the collective, so it is
split into the wait (a barrier first, timed alone, which adds a round trip of its own) and the
transfer. Every figure is the median over the
timed steps, per rank; views/s is the timed views over their seconds. A rank's renders and
backward passes are timed through the trainer's StepObserver; the rest of the step is what is
left (sampling, the loss, the packing around the collective, the optimizer, density control).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from turbogs.bench.race import cpu_model_name
from turbogs.data.load import load_scene
from turbogs.device import keep_freed_memory
from turbogs.distributed.world import World
from turbogs.training.config import get_preset
from turbogs.training.observer import StepObserver
from turbogs.training.trainer import SessionOptions, Trainer


class RenderTimer(StepObserver):
    """The trainer's seam: the seconds of each step's renders and backward passes, summed."""

    def __init__(self, seconds: list):
        self.seconds = seconds

    @contextlib.contextmanager
    def _timed(self):
        started = time.perf_counter()
        yield
        self.seconds[-1] += time.perf_counter() - started

    def render(self):
        return self._timed()

    def backward(self):
        return self._timed()


def run_rank(rank: int, size: int, args, port: int, results) -> None:
    torch.set_num_threads(1)
    if size > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=size)
    world = World(rank, size, rank, "gloo" if size > 1 else None)
    scene = load_scene(args.scene, resolution=args.resolution, eval_split=True, log=lambda *_: None)
    cfg = get_preset("turbo")
    cfg.coarse_to_fine.enabled = False  # every step at the requested size: the steps compare one to one
    steps, warmup = args.views // size, args.warmup // size
    cfg = cfg.for_run(steps=steps, world_size=size)
    times = {"step": [], "collective": [], "wait": [], "transfer": [], "view": []}
    original = world.reduce_sum_and_max

    def timed_reduce(summed, maxed):
        started = time.perf_counter()
        if size > 1:
            dist.barrier()  # the wait for the slower rank, alone
        waited = time.perf_counter()
        original(summed, maxed)
        ended = time.perf_counter()
        times["wait"].append(waited - started)
        times["transfer"].append(ended - waited)  # its own median: not the median collective less the median wait
        times["collective"].append(ended - started)

    world.reduce_sum_and_max = timed_reduce
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(scene, cfg, SessionOptions(out_dir=Path(tmp), evaluate=False, progress=False,
                                                     log=lambda *_: None, world=world))
        trainer.observer = RenderTimer(times["view"])
        for step in range(steps):
            times["view"].append(0.0)
            started = time.perf_counter()
            trainer.timed_step()
            times["step"].append(time.perf_counter() - started)
        count = len(trainer.gaussians)
    summary = {key: statistics.median(values[warmup:]) if len(values) > warmup else 0.0
               for key, values in times.items()}
    summary["mean_wait"] = statistics.mean(times["wait"][warmup:]) if len(times["wait"]) > warmup else 0.0
    summary["views_per_second"] = (steps - warmup) * size / sum(times["step"][warmup:])
    summary["gaussians"] = count
    results[rank] = summary
    if size > 1:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", required=True)
    parser.add_argument("-r", "--resolution", type=int, default=None)
    parser.add_argument("--views", type=int, default=800)
    parser.add_argument("--warmup", type=int, default=200, help="views trained before the clock starts")
    args = parser.parse_args()
    keep_freed_memory()  # as every CPU command does
    print(f"CPU: {cpu_model_name()}, {os.cpu_count()} cores; torch {torch.__version__}; "
          f"{args.scene} -r {args.resolution}")
    one = {}
    run_rank(0, 1, args, 0, one)
    manager = mp.Manager()
    two = manager.dict()
    port = 29500 + os.getpid() % 1000
    mp.spawn(run_rank, args=(2, args, port, two), nprocs=2, join=True)
    print(f"1 process: {one[0]['step'] * 1e3:.2f} ms a step of 1 view "
          f"(render and backward {one[0]['view'] * 1e3:.2f} ms) "
          f"({one[0]['views_per_second']:.1f} views/s), "
          f"{one[0]['gaussians']} Gaussians at the end")
    for rank in (0, 1):
        r = two[rank]
        print(f"2 ranks, rank {rank}: {r['step'] * 1e3:.2f} ms a step of 2 views "
              f"(render and backward {r['view'] * 1e3:.2f} ms); "
              f"collective {r['collective'] * 1e3:.2f} ms "
              f"(waiting for the other rank {r['wait'] * 1e3:.2f} ms, mean {r['mean_wait'] * 1e3:.2f}, "
              f"the transfer {r['transfer'] * 1e3:.2f} ms); "
              f"{two[rank]['gaussians']} Gaussians")
    print(f"views/s, 2 ranks / 1 process: {two[0]['views_per_second'] / one[0]['views_per_second']:.2f}x "
          f"({two[0]['views_per_second']:.1f} against {one[0]['views_per_second']:.1f})")


if __name__ == "__main__":
    main()
