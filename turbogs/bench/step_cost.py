"""`turbogs bench --step-cost`: seconds per render + loss + backward with 100%, 50% and 25%
of the tiles rendered (step_cost.json), optionally with torch.profiler's costliest ops of those
and of whole training steps (profile.txt)."""

from __future__ import annotations

import math
import statistics
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch

from turbogs import kernels
from turbogs.bench.race import BenchSettings, base_config, load_bench_scene, machine_info
from turbogs.bench.step_trainer import RUN_STEPS, replicated_gaussians, trainer_at, without_points
from turbogs.fileio import atomic_write_json, atomic_write_text
from turbogs.training.clock import synchronize
from turbogs.training.outdir import check_output_dir
from turbogs.training.start import initial_gaussians

STEP_COST_FRACTIONS = (1.0, 0.5, 0.25)
# Where in a run the profile's whole training steps are taken: turbo renders every tile early in
# a run and a share of them late, and a step of each kind is profiled.
PROFILE_PROGRESS = (0.1, 0.7)


# --- step cost ----------------------------------------------------------------------


def random_tile_mask(tile_rows: int, tile_cols: int, fraction: float, generator: torch.Generator) -> torch.Tensor:
    """[TH, TW] bool with exactly ceil(fraction * tiles) tiles set, chosen uniformly."""
    total = tile_rows * tile_cols
    count = min(total, max(1, math.ceil(fraction * total - 1e-9)))
    mask = torch.zeros(total, dtype=torch.bool)
    mask[torch.randperm(total, generator=generator)[:count]] = True
    return mask.reshape(tile_rows, tile_cols)


def run_step_cost(settings: BenchSettings, repeats: int = 7, num_gaussians: Optional[int] = None,
                  profile: bool = False) -> dict:
    """Median seconds of render + tile loss + backward at each fraction of tiles rendered.

    The fractions take turns within each repeat (same view, same Gaussians), so that a
    change in machine load hits all of them alike. 100% renders without a tile mask, as
    a dense step does; the loss is the turbo tile loss over the rendered tiles. All SH
    bands are active, as late in training. With `profile`, torch.profiler's tables go to
    profile.txt: the costliest ops of a few full and quarter steps, and of whole training steps
    of the first preset at PROFILE_PROGRESS of a run, started from as many Gaussians along the
    camera rays (bench/step_trainer.py).
    """
    from turbogs.render import render
    from turbogs.tiles import tile_grid
    from turbogs.turbo.losses import TileLoss

    check_output_dir(settings.out_dir)
    scene = load_bench_scene(settings)
    device = settings.device
    kernels.prepare_kernels(device, settings.log)  # compiled (once) before anything is timed
    cfg = base_config(settings.presets[0], settings)
    generator = torch.Generator().manual_seed(settings.seed)
    gaussians = initial_gaussians(scene, cfg, generator)
    if num_gaussians is not None:
        gaussians = replicated_gaussians(gaussians, num_gaussians, generator)
    gaussians = gaussians.to(device)
    gaussians.active_sh_degree = gaussians.sh_degree
    loss_fn = TileLoss()
    background = torch.zeros(3, device=device)

    def one_step(camera, gt, mask: Optional[torch.Tensor]) -> float:
        tile_ids = torch.nonzero(mask.reshape(-1)).squeeze(1).to(device)
        synchronize(device)
        started = time.perf_counter()
        out = render(gaussians, camera, background=background,
                     tile_mask=None if bool(mask.all()) else mask.to(device))
        loss, _ = loss_fn(out.image, gt, tile_ids)
        loss.backward()
        synchronize(device)
        seconds = time.perf_counter() - started
        for p in gaussians.parameters():
            p.grad = None
        return seconds

    times: Dict[float, List[float]] = {f: [] for f in STEP_COST_FRACTIONS}
    tiles: Dict[float, int] = {}
    total_tiles = 0
    for repeat in range(repeats + 1):  # the first round warms up and is not counted
        camera = scene.train[repeat % len(scene.train)]
        gt = camera.image.to(device)
        rows, cols = tile_grid(camera.height, camera.width)
        total_tiles = rows * cols
        for fraction in STEP_COST_FRACTIONS:
            mask = random_tile_mask(rows, cols, fraction, generator)
            seconds = one_step(camera, gt, mask)
            tiles[fraction] = int(mask.sum())
            if repeat > 0:
                times[fraction].append(seconds)

    medians = {f: statistics.median(times[f]) for f in STEP_COST_FRACTIONS}
    result = {
        "scene": str(settings.scene),
        "device": str(device),
        "backend": kernels.backend_name(device),
        "machine": machine_info(device),
        "command": settings.command,
        "settings": list(settings.config_settings),
        "image_size": [scene.train[0].width, scene.train[0].height],
        "num_gaussians": len(gaussians),
        "repeats": repeats,
        "loss": "TileLoss (L1 + D-SSIM + NCC over the rendered tiles)",
        "fractions": [{"fraction": f, "tiles": tiles[f], "total_tiles": total_tiles,
                       "seconds_per_step": round(medians[f], 6), "all_seconds": [round(t, 6) for t in times[f]]}
                      for f in STEP_COST_FRACTIONS],
        "ratio_to_full": {str(f): round(medians[f] / medians[1.0], 4) for f in STEP_COST_FRACTIONS},
    }
    atomic_write_json(settings.out_dir / "step_cost.json", result)
    if profile:
        camera = scene.train[0]
        rows, cols = tile_grid(camera.height, camera.width)
        masks = {f: random_tile_mask(rows, cols, f, generator) for f in (1.0, 0.25)}
        without_points(scene)
        trainers = {f"{settings.presets[0]}, at {p:.0%} of a {RUN_STEPS}-step run, from {len(gaussians)} Gaussians "
                    f"along the camera rays": trainer_at(scene, cfg, len(gaussians), p, settings.out_dir, device)
                    for p in PROFILE_PROGRESS}
        write_profile(settings.out_dir / "profile.txt", lambda f: one_step(camera, camera.image.to(device), masks[f]),
                      device, f"{len(gaussians)} Gaussians, {camera.width}x{camera.height} px",
                      whole_steps={what: trainer.timed_step for what, trainer in trainers.items()})
    settings.log(f"step cost on {device}, {len(gaussians)} Gaussians, {result['image_size'][0]}x"
                 f"{result['image_size'][1]} px, median of {repeats}:")
    for f in STEP_COST_FRACTIONS:
        settings.log(f"  {f:>4.0%} of tiles ({tiles[f]}/{total_tiles}): {medians[f] * 1e3:8.2f} ms/step, "
                     f"{medians[f] / medians[1.0]:.2f}x the full step")
    settings.log(f"wrote {settings.out_dir / 'step_cost.json'}" + (" and profile.txt" if profile else ""))
    return result


def write_profile(path: Path, step: Callable[[float], float], device: torch.device, what: str,
                  steps: int = 3, rows: int = 25, whole_steps: Optional[Dict[str, Callable[[], float]]] = None) -> None:
    """torch.profiler's costliest ops (self time on the device, else on the CPU) over a
    few steps with all tiles and with a quarter of them; for each of `whole_steps` (what it is:
    one training step), also one whole training step (sampling, loss, backward, density control,
    optimizer: everything the trainer does around the render), after a few untimed ones."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    sections = [f"render + tile loss + backward on {device}, {what}; {steps} steps each, sorted by {sort_by}"]
    for fraction in (1.0, 0.25):
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step(fraction)
        sections.append(f"== {fraction:.0%} of tiles\n" + prof.key_averages().table(sort_by=sort_by, row_limit=rows))
    for whole_what, trainer_step in (whole_steps or {}).items():
        for _ in range(steps):
            trainer_step()
        with profile(activities=activities) as prof:
            trainer_step()
        sections.append(f"== one whole training step ({whole_what})\n"
                        + prof.key_averages().table(sort_by=sort_by, row_limit=rows))
    atomic_write_text(path, "\n\n".join(sections) + "\n")
