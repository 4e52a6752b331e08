"""What agreeing on a stop costs a data-parallel step: 2 gloo ranks on this machine.

    python benchmarks/stop_agreement.py [SCENE] [--preset turbo] [--steps 20] [--repeats 8]

Why: with several ranks a SIGTERM may reach one rank only, so every rank shows its stop flag to
the others in one small all-gather at the same steps (turbogs/training/stop.py); the trainer does
it every RANKS_READ_EVERY steps. This measures, side by side in one run, training steps of the
real trainer without the all-gather and with it after every step (the worst case), in blocks of
--steps steps, --repeats pairs of blocks in the order ABBA ABBA ... (so that a drift of the
machine's load or of the step's cost does not favour one side); it reports the median time per
step of each, the median of the pairs' differences (the all-gather's cost per step) and that
cost spread over the trainer's RANKS_READ_EVERY steps. It also times the all-gather alone (mean
of 500 calls). The run is sized for 100,000 steps, so that its schedules (sparsity, densification)
barely move during the measurement. Each rank runs one torch thread, as `turbogs train --nproc`
sets it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]


def worker(rank: int, init_file: str, args, results) -> None:
    from turbogs.data.load import load_scene
    from turbogs.distributed.world import World, exit_rank
    from turbogs.training.config import get_preset
    from turbogs.training.stop import StopAgreement, StopSignals
    from turbogs.training.trainer import SessionOptions, Trainer

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    world = World(rank, 2, rank, "gloo")
    scene = load_scene(args.scene, resolution=args.resolution, log=lambda message: None)
    cfg = get_preset(args.preset).for_run(100_000, world_size=2)
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=Path(init_file).parent, progress=False,
                                             log=lambda message: None, world=world))
    every_step = StopAgreement(world, StopSignals(), every=1)

    def block(agree: bool) -> float:
        dist.barrier()
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer.timed_step()
            if agree:
                every_step.check(trainer.step)
        return (time.perf_counter() - start) / args.steps

    for _ in range(args.warmup):
        trainer.timed_step()
    plain, agreed = [], []
    for pair in range(args.repeats):
        for agree in ((False, True) if pair % 2 == 0 else (True, False)):
            (agreed if agree else plain).append(block(agree))
    dist.barrier()
    start = time.perf_counter()
    for _ in range(500):
        world.gather_floats([0.0, 0.0])
    alone = (time.perf_counter() - start) / 500
    if rank == 0:
        results["plain"], results["agreed"], results["alone"] = plain, agreed, alone
    dist.destroy_process_group()
    exit_rank(0)  # past libtorch's C++ teardown, where a gloo rank can abort (see exit_rank)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("scene", nargs="?", default=str(REPO / "scenes" / "demo"))
    parser.add_argument("--preset", default="turbo")
    parser.add_argument("-r", "--resolution", type=int, default=None)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=int, default=8, help="blocks of each kind, interleaved")
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from turbogs.training.trainer import RANKS_READ_EVERY

    results = mp.Manager().dict()
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(worker, args=(os.path.join(scratch, "init"), args, results), nprocs=2, join=True)
    plain, agreed = statistics.median(results["plain"]), statistics.median(results["agreed"])
    cost = statistics.median(b - a for a, b in zip(results["plain"], results["agreed"]))
    print(f"`python benchmarks/stop_agreement.py {' '.join(sys.argv[1:])}` "
          f"(2 gloo ranks, {args.repeats} pairs of blocks of {args.steps} steps, ABBA order)\n")
    print("| | ms per step (median of blocks) | blocks (ms per step) |")
    print("|---|---:|---|")
    print(f"| steps | {plain * 1e3:.2f} | {', '.join(f'{x * 1e3:.1f}' for x in results['plain'])} |")
    print(f"| steps + an all-gather of the stop flags after each | {agreed * 1e3:.2f} | "
          f"{', '.join(f'{x * 1e3:.1f}' for x in results['agreed'])} |")
    print(f"\nthe all-gather alone: {results['alone'] * 1e3:.3f} ms per call (mean of 500)")
    print(f"its cost in a step (median of the pairs' differences): {cost * 1e3:+.3f} ms ({cost / plain:+.2%} "
          "of a step) when made every step; "
          f"{cost / RANKS_READ_EVERY * 1e3:+.4f} ms ({cost / RANKS_READ_EVERY / plain:+.3%}) per step as the "
          f"trainer makes it, every {RANKS_READ_EVERY} steps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
