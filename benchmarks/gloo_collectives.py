"""What one collective costs on gloo (the CPU backend), 2 ranks on this machine, by size.

    python benchmarks/gloo_collectives.py [--sizes 1,1000,90000,360000] [--repeats 200]

Why: a data-parallel step sends one flat buffer (gradients, density statistics, figures)
per step, and on a 2-core machine a millisecond per step is 2-3% of a step. This measures,
side by side in one run and for each buffer size in float32 values, the mean time of:
`all_reduce` (SUM), the same followed by a second, small MAX all-reduce, one gloo `all_gather` of
both buffers, and the same gathered by an exchange of messages between the ranks
(`World.all_gather` on gloo, what `World.reduce_sum_and_max` uses). Each rank runs one torch
thread, as `turbogs train --nproc` sets it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed(function, repeats: int) -> float:
    """Mean seconds per call, both ranks starting together."""
    for _ in range(20):
        function()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def worker(rank: int, init_file: str, sizes, repeats: int, results) -> None:
    from turbogs.distributed.world import World, exit_rank

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    world = World(rank, 2, rank, "gloo")
    for size in sizes:
        summed, maxed = torch.ones(size), torch.ones(max(size // 50, 1))  # the max part: one value per Gaussian
        both = torch.cat([summed, maxed])
        gathered = [torch.empty_like(both) for _ in range(2)]

        def two_all_reduces():
            dist.all_reduce(summed)
            dist.all_reduce(maxed, op=dist.ReduceOp.MAX)

        row = {"all_reduce": timed(lambda: dist.all_reduce(summed), repeats),
               "all_reduce_sum_then_max": timed(two_all_reduces, repeats),
               "all_gather_both": timed(lambda: dist.all_gather(gathered, both), repeats),
               "exchange_both": timed(lambda: world.all_gather(both), repeats)}
        if rank == 0:
            results[size] = row
    dist.destroy_process_group()
    exit_rank(0)  # past libtorch's C++ teardown, where a gloo rank can abort (see exit_rank)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1000,10000,90000,360000", help="float32 values per buffer")
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    results = mp.Manager().dict()
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(worker, args=(os.path.join(scratch, "init"), sizes, args.repeats, results), nprocs=2, join=True)
    print(f"`python benchmarks/gloo_collectives.py {' '.join(sys.argv[1:])}` (ms per call, mean of {args.repeats})\n")
    print("| floats | all_reduce SUM | SUM + small MAX | one all_gather of both | both by an exchange (World.all_gather) |")
    print("|---:|---:|---:|---:|---:|")
    for size in sizes:
        row = results[size]
        print(f"| {size} | {row['all_reduce'] * 1e3:.2f} | {row['all_reduce_sum_then_max'] * 1e3:.2f} | "
              f"{row['all_gather_both'] * 1e3:.2f} | {row['exchange_both'] * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
