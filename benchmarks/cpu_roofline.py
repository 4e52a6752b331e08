"""How close the CPU compositing kernels come to the core: Gaussian-pixel evaluations per second
and FLOP/s of the native forward and backward passes on one thread, as a fraction of one core's
peak.

    python benchmarks/cpu_roofline.py --scene PATH [-r 4] [--model MODEL_DIR] [--views 4]
        [--repeats 5] [--fma-units 2]

Inputs: each of --views training views rendered from a trained model's Gaussians (--model, the
last iteration of a `turbogs train` folder; else the capture's start, as training begins), all
tiles, all SH bands, and the blame probe's two extra channels, as a training step renders them.

What is counted. The kernels composite each (tile, Gaussian) pair over the box of pixels its
alpha-threshold ellipse reaches, `kLanes` columns at a time (cuda/cpu/rasterize_cpu_tile.h,
`TileGaussians::load`). This script recomputes those boxes with the same rule and counts the
lanes issued, rows x whole vectors x lanes per pair: the work the kernels issue at most (a pixel
already opaque keeps its lane; a vector none of whose lanes can pass the threshold skips its exp,
so the FLOP figure is an upper bound too). FLOPs per lane, counted from the kernels' source:
the forward 7 (the exponent) + 23 (the float32 exp) + 2 (alpha) + 2 per channel + 2 (the
transmittance); the backward recomputes the alpha (32) and adds about 30 + 4 per channel.
Peak of one core: lanes (16 float32 lanes with AVX-512, 8 with AVX2) x FMA units x 2 FLOPs x
clock (lscpu's "CPU max MHz", else /proc/cpuinfo's "cpu MHz"). The kernels use no fused
multiply-add (built for plain x86-64's rounding, so that every copy gives the twin's bits), so
their own ceiling is half that: both fractions are printed.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import torch

from turbogs import kernels
from turbogs.bench.race import cpu_model_name
from turbogs.data.load import load_scene
from turbogs.formats.model_folder import load_gaussians
from turbogs.render import EPS2D
from turbogs.tiles import TILE_SIZE, tile_grid
from turbogs.training.config import get_preset
from turbogs.training.start import initial_gaussians

ALPHA_THRESHOLD, SKIP_MARGIN = 1.0 / 255.0, 1e-3  # rasterize_cpu.cpp's
FORWARD_FLOPS = (7 + 23 + 2 + 2, 2)  # per lane: fixed, and per channel
BACKWARD_FLOPS = (32 + 30, 4)


def machine_peak(fma_units: int) -> tuple:
    """(float32 lanes, clock in GHz, peak GFLOP/s of one core with FMA)."""
    flags = Path("/proc/cpuinfo").read_text()
    lanes = 16 if " avx512f" in flags else 8 if " avx2" in flags else 4
    mhz = None
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("CPU max MHz"):
                mhz = float(line.split(":")[1])
    except (OSError, subprocess.CalledProcessError):
        pass
    if mhz is None:
        mhz = max(float(line.split(":")[1]) for line in flags.splitlines() if line.startswith("cpu MHz"))
    return lanes, mhz / 1000, lanes * fma_units * 2 * mhz / 1000


def lanes_issued(means2d, conics, opacities, offsets, ids, width, height, lanes) -> int:
    """Sum over (tile, Gaussian) pairs of rows x whole vectors x lanes of the Gaussian's box in
    the tile, by the kernels' rule (TileGaussians::load)."""
    rows_t, cols_t = offsets.shape
    starts = offsets.reshape(-1).long()
    ends = torch.cat([starts[1:], torch.tensor([ids.numel()])])
    tile = torch.repeat_interleave(torch.arange(rows_t * cols_t), ends - starts)
    g = ids.long()
    x0, y0 = (tile % cols_t) * TILE_SIZE, (tile // cols_t) * TILE_SIZE
    rows = (height - y0).clamp(max=TILE_SIZE)
    cols = (width - x0).clamp(max=TILE_SIZE)
    a, b, c = conics[g, 0].double(), conics[g, 1].double(), conics[g, 2].double()
    det = a * c - b * b
    level = torch.log(ALPHA_THRESHOLD / opacities[g].double()) - SKIP_MARGIN
    ellipse = (a > 0) & (det > 0)
    reach_y = torch.sqrt((-2 * a * level / det).clamp_min(0))
    reach_x = torch.sqrt((-2 * c * level / det).clamp_min(0))
    gx, gy = means2d[g, 0].double(), means2d[g, 1].double()
    row_lo = torch.minimum(torch.maximum(torch.ceil(gy - reach_y - 0.5 - y0) - 1, torch.zeros(1)), rows.double())
    row_hi = torch.minimum(torch.maximum(torch.floor(gy + reach_y - 0.5 - y0) + 1, -torch.ones(1)), rows - 1.0)
    col_lo = torch.minimum(torch.maximum(torch.ceil(gx - reach_x - 0.5 - x0) - 1, torch.zeros(1)), cols.double())
    col_hi = torch.minimum(torch.maximum(torch.floor(gx + reach_x - 0.5 - x0) + 1, -torch.ones(1)), cols - 1.0)
    whole = ~ellipse  # not positive definite: the whole tile
    row_lo, row_hi = torch.where(whole, 0, row_lo), torch.where(whole, rows - 1.0, row_hi)
    col_lo, col_hi = torch.where(whole, 0, col_lo), torch.where(whole, cols - 1.0, col_hi)
    first = col_lo - torch.remainder(col_lo, lanes)
    vectors = torch.where(col_hi >= col_lo, torch.floor((col_hi - first) / lanes) + 1, 0)
    box_rows = (row_hi - row_lo + 1).clamp_min(0)
    return int((box_rows * vectors).sum()) * lanes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", required=True)
    parser.add_argument("-r", "--resolution", type=int, default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fma-units", type=int, default=2,
                        help="FMA units per core (2 on Xeon Gold/Platinum and Zen 4)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    kernels.use_torch_twins(False)
    if kernels.backend_name(torch.device("cpu")) != "cpu-native":
        raise SystemExit("the native CPU kernels could not be built here")
    scene = load_scene(args.scene, resolution=args.resolution, eval_split=True, log=lambda *_: None)
    if args.model:
        gaussians = load_gaussians(Path(args.model), torch.device("cpu"))[0]
    else:
        gaussians = initial_gaussians(scene, get_preset("turbo"), torch.Generator().manual_seed(0))
        gaussians.active_sh_degree = gaussians.sh_degree
    lanes, ghz, peak = machine_peak(args.fma_units)
    print(f"CPU: {cpu_model_name()}; {lanes} float32 lanes, {ghz:.2f} GHz, {args.fma_units} FMA units: "
          f"peak {peak:.1f} GFLOP/s a core ({peak / 2:.1f} without FMA); torch {torch.__version__}, 1 thread")
    print(f"{args.scene} -r {args.resolution}, {len(gaussians)} Gaussians"
          f"{' of ' + args.model if args.model else ' (the start)'}; median of {args.repeats} per view")
    totals = {"forward": [0.0, 0, 0.0], "backward": [0.0, 0, 0.0]}  # seconds, lanes, GFLOP
    for camera in scene.train[: args.views]:
        width, height = camera.width, camera.height
        rows_t, cols_t = tile_grid(height, width)
        with torch.no_grad():
            radii, means2d, depths, conics = kernels.project(
                gaussians.means, gaussians.params["quats"], gaussians.scales, camera.world_to_cam, camera.K, width,
                height, 0.01, 1e10, EPS2D)
            dirs = gaussians.means - camera.center
            colors = kernels.spherical_harmonics(gaussians.sh_degree, dirs, gaussians.sh) + 0.5
            colors = torch.cat([colors.clamp_min(0), torch.zeros(len(gaussians), 2)], -1)  # + the blame probe
            offsets, ids = kernels.intersect_tiles(means2d, radii, depths, TILE_SIZE, cols_t, rows_t)
        inputs = [t.detach().clone().requires_grad_() for t in (means2d, conics, colors, gaussians.opacities)]
        forward, backward = [], []
        for _ in range(args.repeats + 1):
            started = time.perf_counter()
            image, alpha = kernels.rasterize(*inputs, width, height, TILE_SIZE, offsets, ids)
            middle = time.perf_counter()
            torch.autograd.backward([image, alpha], [torch.ones_like(image), torch.ones_like(alpha)])
            ended = time.perf_counter()
            forward.append(middle - started)
            backward.append(ended - middle)
        count = lanes_issued(means2d, conics, gaussians.opacities.detach(), offsets, ids, width, height, lanes)
        channels = colors.shape[1]
        for name, times, flops in (("forward", forward[1:], FORWARD_FLOPS), ("backward", backward[1:], BACKWARD_FLOPS)):
            seconds = statistics.median(times)
            totals[name][0] += seconds
            totals[name][1] += count
            totals[name][2] += count * (flops[0] + flops[1] * channels) / 1e9
        print(f"  view {camera.name}: {ids.numel()} pairs, {count / 1e6:.1f} M lanes; forward "
              f"{statistics.median(forward[1:]) * 1e3:.1f} ms, backward {statistics.median(backward[1:]) * 1e3:.1f} ms")
    for name, (seconds, count, gflop) in totals.items():
        rate = gflop / seconds
        print(f"{name:>8}: {count / seconds / 1e9:.2f} G lane evaluations/s, {rate:.1f} GFLOP/s: "
              f"{rate / peak:.1%} of the core's peak, {rate / (peak / 2):.1%} of its peak without FMA")


if __name__ == "__main__":
    main()
