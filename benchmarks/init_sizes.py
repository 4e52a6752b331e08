"""Seconds and accuracy of the initial Gaussian sizes (gaussians.mean_knn_distance: each point's
root mean square distance to its 3 nearest neighbours) against all pairs by torch.cdist in its
default mode (what the package computed before the grid search), on one thread.

    python benchmarks/init_sizes.py [--points 100000] [--check 2000]

Two clouds: uniform in the unit cube, and a mix (a tight cluster, a wide shell, a flat sheet) of
1.2x as many points. Accuracy: the largest relative error on --check random points against
float64 differences.
"""

from __future__ import annotations

import argparse
import time

import torch

from turbogs import gaussians
from turbogs.bench.race import cpu_model_name


def all_pairs_by_cdist(points: torch.Tensor, k: int = 3, chunk: int = 4096) -> torch.Tensor:
    out = torch.empty(points.shape[0])
    for start in range(0, points.shape[0], chunk):
        block = points[start:start + chunk]
        d2 = torch.cdist(block, points).pow_(2)
        d2[torch.arange(block.shape[0]), torch.arange(start, start + block.shape[0])] = float("inf")
        out[start:start + chunk] = d2.topk(k, dim=1, largest=False).values.clamp_min(1e-14).mean(1).sqrt()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=100_000)
    parser.add_argument("--check", type=int, default=2000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    n = args.points
    clouds = {f"uniform {n}": torch.rand(n, 3, generator=g),
              f"mixed {n * 6 // 5}": torch.cat([torch.randn(n // 2, 3, generator=g) * 0.05,
                                                torch.randn(n // 4, 3, generator=g) * 3,
                                                torch.rand(n - n // 2 - n // 4 + n // 5, 3, generator=g)
                                                * torch.tensor([4.0, 4.0, 0.001])])}
    print(f"CPU: {cpu_model_name()}; torch {torch.__version__}, 1 thread")
    for name, points in clouds.items():
        timed = {}
        for method, function in (("all pairs (cdist)", all_pairs_by_cdist),
                                 ("mean_knn_distance", gaussians.mean_knn_distance)):
            started = time.perf_counter()
            timed[method] = (function(points), time.perf_counter() - started)
        rows = torch.randperm(points.shape[0], generator=g)[: args.check]
        d2 = (points[rows, None].double() - points[None].double()).pow(2).sum(-1)
        d2[torch.arange(rows.numel()), rows] = float("inf")
        exact = d2.topk(3, dim=1, largest=False).values.clamp_min(1e-14).mean(1).sqrt()
        errors = {method: float(((sizes[rows].double() - exact).abs() / exact).max())
                  for method, (sizes, _) in timed.items()}
        print(f"{name}: " + ", ".join(f"{method} {seconds:.1f} s (largest relative error {errors[method]:.1e})"
                                      for method, (_, seconds) in timed.items()), flush=True)


if __name__ == "__main__":
    main()
