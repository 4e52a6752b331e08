"""Seconds per forward+backward render step on the CPU (torch backend).

A random scene in front of one 128x96 camera: Gaussians spread through the view frustum
at depths 2..6, with screen-space sizes of about 1..6 px (log-uniform, mildly
anisotropic), so that a tile holds a realistic mix of small and large splats. One step is
render -> L1 against a fixed target -> backward. Prints the median of several steps for
each Gaussian count, for all tiles and for a tile-masked step (about a quarter of the
tiles, as turbo training renders), in wall-clock and in CPU seconds.

    python benchmarks/step_cost_cpu.py [--threads 1] [--repeats 7] [--counts 2000 10000]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch

from turbogs.data.scene import Camera
from turbogs.gaussians import Gaussians, num_sh_bases
from turbogs.render import render
from turbogs.tiles import tile_grid

WIDTH, HEIGHT = 128, 96
FOCAL = 110.0


def make_camera() -> Camera:
    K = torch.tensor([[FOCAL, 0, WIDTH / 2], [0, FOCAL, HEIGHT / 2], [0, 0, 1]], dtype=torch.float32)
    return Camera(name="bench", width=WIDTH, height=HEIGHT, K=K, world_to_cam=torch.eye(4))


def make_gaussians(n: int, seed: int = 0, sh_degree: int = 3) -> Gaussians:
    g = torch.Generator().manual_seed(seed)
    depth = 2.0 + 4.0 * torch.rand(n, generator=g)
    # Pixel positions a little beyond the image, so border tiles see partial splats.
    u = (torch.rand(n, generator=g) * 1.2 - 0.1) * WIDTH
    v = (torch.rand(n, generator=g) * 1.2 - 0.1) * HEIGHT
    means = torch.stack([(u - WIDTH / 2) / FOCAL * depth, (v - HEIGHT / 2) / FOCAL * depth, depth], dim=-1)
    size_px = torch.exp(math.log(1.0) + (math.log(6.0) - math.log(1.0)) * torch.rand(n, generator=g))
    aniso = torch.exp(0.4 * torch.randn(n, 3, generator=g))
    scales = (size_px * depth / FOCAL)[:, None] * aniso
    params = {
        "means": means,
        "scales": torch.log(scales),
        "quats": torch.randn(n, 4, generator=g),
        "opacities": torch.randn(n, generator=g),
        "sh0": torch.randn(n, 1, 3, generator=g) * 0.5,
        "shN": torch.randn(n, num_sh_bases(sh_degree) - 1, 3, generator=g) * 0.05,
    }
    return Gaussians(params, sh_degree=sh_degree, active_sh_degree=sh_degree)


def step_seconds(gaussians: Gaussians, camera: Camera, target: torch.Tensor, repeats: int, tile_mask=None):
    """Median wall-clock and CPU seconds of one step (CPU time is the steadier figure on
    a shared machine)."""
    wall, cpu = [], []
    for i in range(repeats + 2):  # two warm-up steps
        gaussians.zero_grad(set_to_none=True)
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        out = render(gaussians, camera, tile_mask=tile_mask)
        loss = (out.image - target).abs().mean()
        loss.backward()
        if i >= 2:
            wall.append(time.perf_counter() - start_wall)
            cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--counts", type=int, nargs="+", default=[2000, 10000])
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    camera = make_camera()
    target = torch.rand(HEIGHT, WIDTH, 3, generator=torch.Generator().manual_seed(1))
    tile_height, tile_width = tile_grid(HEIGHT, WIDTH)
    quarter = torch.rand(tile_height, tile_width, generator=torch.Generator().manual_seed(2)) < 0.25
    print(f"CPU render step (forward+backward), {WIDTH}x{HEIGHT}, {args.threads} thread(s), "
          f"median of {args.repeats}")
    for n in args.counts:
        gaussians = make_gaussians(n)
        full_wall, full_cpu = step_seconds(gaussians, camera, target, args.repeats)
        masked_wall, masked_cpu = step_seconds(gaussians, camera, target, args.repeats, tile_mask=quarter)
        print(f"  {n:6d} Gaussians: all tiles {full_wall:.4f} s/step (cpu {full_cpu:.4f}), "
              f"{int(quarter.sum())}/{quarter.numel()} tiles {masked_wall:.4f} s/step (cpu {masked_cpu:.4f})")

if __name__ == "__main__":
    main()
