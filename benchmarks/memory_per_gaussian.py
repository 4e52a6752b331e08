"""Memory per Gaussian, from TurboGS's own layout: the tables of docs/SCALING.md.

Everything a run keeps per Gaussian is counted here in float32 words (4 bytes), from the
code that allocates it:

- parameters: turbogs/gaussians.py (means 3, scales 3, quats 4, opacity 1, SH 3 (d+1)^2);
- gradients: one per parameter, alive from backward until the optimizer's zero_grad;
- optimizer state: torch's Adam (exp_avg, exp_avg_sq); the hybrid (turbogs/optim/hybrid.py) is
  Adam's for the parameters it does not curve and, for those it curves (the means by default), a
  HybridOptimizer's: exp_avg, exp_avg_sq, hessian shaped like the parameter, row_step and
  hessian_count (a word per row each), and its curvature cache;
- density statistics: turbogs/density/vanilla.py (grad2d, count, max_radii2d) or
  turbogs/density/error_driven.py (blame, weight, exposed, fade);
- the optimizer step's transients (none for fused Adam; six copies of the curved parameters in the hybrid);
- the render step's transients (turbogs/render/__init__.py on the gsplat 1.5.3 kernels): an
  itemised *estimate*, per Gaussian, per (Gaussian, view) and per (Gaussian, tile).

tests/test_memory_per_gaussian.py checks the persistent rows against the real objects and
measures both optimizer steps' transients; the render estimate needs a GPU to pin down.

    python benchmarks/memory_per_gaussian.py [--sh-degree 3] [--visible 0.25] [--tiles 8]
"""

from __future__ import annotations

import argparse
from typing import Dict

from turbogs.density.error_driven import PROBE_CHANNELS
from turbogs.gaussians import num_sh_bases
from turbogs.optim.hybrid import HybridConfig
from turbogs.training.preflight import params_per_gaussian

WORD = 4  # bytes of a float32 (and of an int32)
GB = 1e9  # decimal gigabytes, as GPU vendors count (an H200 has 141 GB)
DEVICES = {"H200 (141 GB)": 141e9, "24 GB card": 24e9}
RESERVE = 0.10  # share of a device kept for the CUDA context, fragmentation and pixel buffers


def render_gaussian_words(sh_degree: int) -> Dict[str, int]:
    """Per-Gaussian transients of a training step that do not depend on the camera: made
    once per step from the parameters, and their gradients in the backward pass."""
    sh = 3 * num_sh_bases(sh_degree)
    return {
        "activated quats, scales, opacity": 4 + 3 + 1,
        "SH coefficients concatenated (Gaussians.sh)": sh,
        "blame probe (error-driven density)": PROBE_CHANNELS,
        "backward: d SH coefficients": sh,
        "backward: d activated quats, scales, opacity; d means; d probe": 4 + 3 + 1 + 3 + PROBE_CHANNELS,
    }


def render_view_words() -> Dict[str, int]:
    """Per (Gaussian, rendered view) transients. turbogs/render/__init__.py computes them for
    every row (culled rows hold zeros); a packed, sharded renderer only for visible pairs."""
    colours = 3 + PROBE_CHANNELS  # composited channels: RGB and the blame probe
    return {
        "projection: radii (2 int32), means2d, depth, conic": 2 + 2 + 1 + 3,
        "zero_culled copies of means2d, depth, conic": 2 + 1 + 3,
        "view direction": 3,
        "colour: SH value, +0.5, clamped; colours+probe": 3 + 3 + 3 + colours,
        "tiles_per_gauss (int32)": 1,
        "backward: d colours+probe, d means2d, d conic, d depth, d view direction": colours + 2 + 3 + 1 + 3,
    }


# Per (Gaussian, tile) intersection: isect_ids int64 + flatten_ids int32, and gsplat's radix
# sort allocates a sorted copy of both (gsplat/cuda/csrc/Intersect.cpp), so 2 x 12 bytes.
# turbogs/kernels/raster_gsplat.py filters the list by the tile mask *after* building it.
INTERSECTION_BYTES = 2 * (8 + 4)
# Sharded (gsplat's packed all-to-all): per visible (Gaussian, view) pair a rank sends or
# receives means2d 2, depth 1, conic 3, opacity 1, colour 3 (+2 probe channels here) floats,
# radii 2 int32 and camera and Gaussian ids (int64 each), and the 12 gradients back.
EXCHANGE_WORDS = (2 + 1 + 3 + 1 + 3 + PROBE_CHANNELS) + 2 + 2 * 2 + (2 + 1 + 3 + 1 + 3 + PROBE_CHANNELS)


def curved_widths(sh_degree: int) -> Dict[str, int]:
    """Floats per Gaussian of each parameter the hybrid curves (its default `curvature_on`)."""
    widths = {"means": 3, "scales": 3, "quats": 4, "opacities": 1, "sh0": 3, "shN": 3 * (num_sh_bases(sh_degree) - 1)}
    return {name: widths[name] for name in HybridConfig().curvature_on}


def curved_words(sh_degree: int) -> int:
    """The HybridOptimizer's own state beyond Adam's, per curved parameter: the curvature EMA
    (`hessian`) and its bias-corrected cache, shaped like the parameter, and three words per row
    (`row_step`, `hessian_count`, `lengthening`)."""
    return sum(2 * width + 3 for width in curved_widths(sh_degree).values())


def persistent_words(sh_degree: int) -> Dict[str, int]:
    """Words per Gaussian that live for the whole run (gradients: from backward to step)."""
    p = params_per_gaussian(sh_degree)
    return {
        "parameters": p,
        "gradients": p,
        "Adam state (exp_avg, exp_avg_sq)": 2 * p,
        "hybrid state (Adam's, and the curved: hessian, row_step, hessian_count, cache)": 2 * p + curved_words(sh_degree),
        "density statistics (vanilla 3, error-driven 4)": 4,
    }


def optimizer_step_words(sh_degree: int, optimizer: str) -> int:
    """Per-Gaussian transients of the optimizer step, alive after the render's are freed.

    torch's fused Adam updates in place: none. The hybrid steps its uncurved parameters with fused
    Adam and its curved ones with one `_foreach` op per stage (turbogs/optim/hybrid_step.py),
    which updates the moments and parameters in place and builds the gradients with a skipped
    step's zeroed (the trainer's `ok` flag), the denominator and the ratio, and while it makes
    the denominator three more (Adam's floor, and the curvature term's bounds from below and
    above): six copies of the curved parameters (the means: 18 floats)."""
    if optimizer == "adam":
        return 0
    return 6 * sum(curved_widths(sh_degree).values())


def persistent_bytes(sh_degree: int, optimizer: str) -> int:
    words = persistent_words(sh_degree)
    state = words["Adam state (exp_avg, exp_avg_sq)"] if optimizer == "adam" else \
        words["hybrid state (Adam's, and the curved: hessian, row_step, hessian_count, cache)"]
    return (words["parameters"] + words["gradients"] + state + words["density statistics (vanilla 3, error-driven 4)"]) * WORD


def replicated_bytes(sh_degree: int, optimizer: str, visible: float, tiles: float) -> float:
    """Bytes per Gaussian on a rank that holds every Gaussian and renders one view at a time:
    the persistent state, the step's transients for all rows, and the intersections of the
    `visible` share of Gaussians, each touching `tiles` 16x16 tiles."""
    render = (sum(render_gaussian_words(sh_degree).values()) + sum(render_view_words().values())) * WORD
    render += visible * tiles * INTERSECTION_BYTES
    return persistent_bytes(sh_degree, optimizer) + max(render, optimizer_step_words(sh_degree, optimizer) * WORD)


def sharded_bytes(sh_degree: int, optimizer: str, visible: float, tiles: float, ranks: int) -> float:
    """Bytes per Gaussian *of the scene* on one of `ranks` shards (gsplat's packed scheme, one
    view per rank): its shard's persistent state and camera-independent transients, its
    shard's visible pairs for all `ranks` views of the step (projected, sent, gradients back),
    and what it receives for its own view (the `visible` share of the whole scene)."""
    pair = (sum(render_view_words().values()) + EXCHANGE_WORDS) * WORD
    sent = visible * pair  # (N / ranks) Gaussians x ranks views x visible share
    received = visible * (pair + tiles * INTERSECTION_BYTES)
    render = sum(render_gaussian_words(sh_degree).values()) * WORD / ranks + sent + received
    step = optimizer_step_words(sh_degree, optimizer) * WORD / ranks
    return persistent_bytes(sh_degree, optimizer) / ranks + max(render, step)


def error_memory_bytes(views: int, height: int, width: int, tile: int = 16) -> int:
    """turbogs/turbo/sampling.py's ErrorMemory: [V, T_max] float32 plus one int64 tile count
    per view."""
    tiles = -(-height // tile) * -(-width // tile)
    return views * (tiles * WORD + 8)


def allreduce_bytes_per_gaussian(sh_degree: int) -> int:
    """Replicated data parallelism: one flat float32 buffer of every gradient, plus the
    density statistics' per-step contributions (4 words, error-driven), summed across ranks every step."""
    return (params_per_gaussian(sh_degree) + 4) * WORD


def fits(bytes_per_gaussian: float, device_bytes: float) -> float:
    """Gaussians (in millions) that fit in a device after the reserve."""
    return device_bytes * (1 - RESERVE) / bytes_per_gaussian / 1e6


def report(sh_degree: int, visible: float, tiles: float) -> str:
    lines = [f"SH degree {sh_degree}, float32; a view sees {visible:.0%} of the Gaussians, each over {tiles:g} tiles",
             "", "| per Gaussian | floats | bytes | GB per million |", "|---|---:|---:|---:|"]
    tables = [("", persistent_words(sh_degree)), ("step, per Gaussian: ", render_gaussian_words(sh_degree)),
              ("step, per (Gaussian, view): ", render_view_words())]
    for prefix, table in tables:
        for name, words in table.items():
            lines.append(f"| {prefix}{name} | {words} | {words * WORD} | {words * WORD / 1e3:.3f} |")
    lines.append(f"| step, per (Gaussian, tile): intersection ids and their sorted copy | | {INTERSECTION_BYTES} | "
                 f"{INTERSECTION_BYTES / 1e3:.3f} |")
    for opt in ("adam", "hybrid"):
        words = optimizer_step_words(sh_degree, opt)
        lines.append(f"| optimizer step transients, {opt} | {words} | {words * WORD} | {words * WORD / 1e3:.3f} |")
    lines.append(f"| sharded, per visible (Gaussian, view) pair: all-to-all buffers | {EXCHANGE_WORDS} | "
                 f"{EXCHANGE_WORDS * WORD} | {EXCHANGE_WORDS * WORD / 1e3:.3f} |")
    lines += ["", "| run (one view at a time) | persistent B/G | peak B/G | GB per million |", "|---|---:|---:|---:|"]
    for opt in ("adam", "hybrid"):
        total = replicated_bytes(sh_degree, opt, visible, tiles)
        lines.append(f"| {opt} | {persistent_bytes(sh_degree, opt)} | {total:.0f} | {total / 1e3:.2f} |")
    header = " | ".join(f"{d}, {o}" for d in DEVICES for o in ("adam", "hybrid"))
    lines += ["", f"Millions of Gaussians that fit ({RESERVE:.0%} of each device kept in reserve)", "",
              f"| ranks | {header} |", "|---|" + "---:|" * 2 * len(DEVICES)]
    for ranks in (1, 2, 4, 8, 16):
        cells = []
        for device_bytes in DEVICES.values():
            for opt in ("adam", "hybrid"):
                per = replicated_bytes(sh_degree, opt, visible, tiles) if ranks == 1 else \
                    sharded_bytes(sh_degree, opt, visible, tiles, ranks)
                cells.append(f"{fits(per, device_bytes):.1f}")
        label = "any, replicated" if ranks == 1 else f"{ranks}, sharded"
        lines.append(f"| {label} | {' | '.join(cells)} |")
    lines += ["", f"replicated all-reduce per step: {allreduce_bytes_per_gaussian(sh_degree)} B per Gaussian",
              f"error memory, 1000 views of 1920x1080: {error_memory_bytes(1000, 1080, 1920) / 1e6:.1f} MB"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sh-degree", type=int, default=3)
    parser.add_argument("--visible", type=float, default=0.25,
                        help="share of the scene's Gaussians that one view sees")
    parser.add_argument("--tiles", type=float, default=8.0,
                        help="16x16 tiles a visible Gaussian touches, on average")
    args = parser.parse_args()
    print(report(args.sh_degree, args.visible, args.tiles))


if __name__ == "__main__":
    main()
