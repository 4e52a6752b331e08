"""`turbogs bench`: train presets side by side and compare their time to quality.

Every preset trains on the same scene load (same train/test split, resolution and seed)
with the same `Trainer` that `turbogs train` uses. Only the training steps are timed:
building the trainer, evaluating and writing files are outside the clock, and on CUDA
the clock is read only after the GPU has finished the step. At fixed points of the run
the test views are evaluated (PSNR, SSIM, and LPIPS when its weights are on disk).

Two ways to size a run, each preset configured as `turbogs train --preset P` with the
same flag would be:

- `--steps N`: a step-based run, every schedule scaled to N steps
  (`TrainConfig.scaled_to(N)`, no time budget); evaluations every N/K steps.
- `--budget-seconds S`: the trainer's time budget (`TrainConfig.budget_seconds`): the
  schedules follow the fraction of the S seconds spent, and the run ends after S
  seconds of training time (or at the preset's step cap, if that comes first).
  Evaluations when the training time passes S/K, 2S/K, ..., S.

A preset named `P@N` runs N steps whatever the bench's sizing (`turbo,3dgs@7000`: turbo's
time budget against 3DGS at 7k steps); "speedup vs run" then says how much sooner turbo
had what 3DGS ended with. `P+ABLATION` switches one TurboGS part off (config.ABLATIONS).

Outputs in --out: bench.json, bench.md (tables) and psnr_vs_time.png (one curve per
preset, drawn with OpenCV). `--step-cost` instead measures seconds per
render + loss + backward with 100%, 50% and 25% of the tiles rendered (step_cost.json).

Peak memory is the growth over what was in use before the preset started: on CUDA
torch's peak allocated bytes; on the CPU the peak resident set size, sampled after
every step and evaluation (the kernel's own peak, VmHWM, cannot be reset between
presets). On the CPU it is approximate: memory freed by an earlier preset can be reused
by the allocator without showing as growth.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import math
import os
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
from tqdm import tqdm

from turbogs.atomic import atomic_path, atomic_write_json, atomic_write_text
from turbogs.config import ABLATIONS, PRESETS, TrainConfig, get_preset
from turbogs.data.scene import Scene
from turbogs.errors import InputError
from turbogs.evaluate import evaluate_views
from turbogs.gaussians import Gaussians
from turbogs.outdir import check_output_dir
from turbogs.train import RunOptions, Trainer, initial_gaussians, synchronize

PSNR_TOLERANCE_DB = 0.1  # "reached b's final PSNR" means within this much of it
STEP_COST_FRACTIONS = (1.0, 0.5, 0.25)
WARMUP_STEPS = 3  # untimed steps before the first preset (see warm_up)


# --- settings -----------------------------------------------------------------------


@dataclass
class BenchSettings:
    scene: Path
    presets: List[str]
    out_dir: Path
    steps: Optional[int] = None  # exactly one of steps / budget_seconds
    budget_seconds: Optional[float] = None
    resolution: Optional[int] = None
    images: str = "images"
    white_background: bool = False
    device: torch.device = torch.device("cpu")
    seed: int = 0
    eval_points: int = 8
    progress: bool = True
    command: str = ""
    log: Callable[[str], None] = print

    def __post_init__(self):
        if self.steps is not None and self.budget_seconds is not None:
            raise InputError("bench: give either --steps N or --budget-seconds S, not both")
        if not self.presets:
            raise InputError("bench: --presets names no preset")
        duplicates = sorted({name for name in self.presets if self.presets.count(name) > 1})
        if duplicates:
            raise InputError(f"bench: preset {duplicates[0]!r} is listed twice in --presets")
        for name in self.presets:
            get_preset(split_steps(name)[0])  # raises naming the known presets

    @property
    def preset_steps(self) -> Dict[str, int]:
        """The presets that run their own number of steps (PRESET@N), with N."""
        sized = {name: split_steps(name)[1] for name in self.presets}
        return {name: steps for name, steps in sized.items() if steps is not None}

    @property
    def mixed_sizing(self) -> bool:
        """Some preset runs its own number of steps instead of the bench's sizing."""
        return bool(self.preset_steps)


def parse_presets(text: str) -> List[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def split_steps(name: str) -> Tuple[str, Optional[int]]:
    """"3dgs@7000" -> ("3dgs", 7000): that preset runs 7000 steps whatever the bench's
    --budget-seconds or --steps, so that a time-budgeted preset can be raced against a
    step-count reference (the paper's "3DGS at 7k steps"). A bare name -> (name, None)."""
    base, at, steps = name.rpartition("@")
    if not at:
        return name, None
    if not steps.isdigit() or int(steps) < 1:
        raise InputError(f"bench: '{name}': the steps after '@' must be a whole number of at least 1")
    return base, int(steps)


# --- timing and memory --------------------------------------------------------------


def resident_bytes() -> Optional[int]:
    """This process's resident set size from /proc (Linux); None elsewhere."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class MemoryMeter:
    """Peak memory growth of one preset (see the module docstring for what is measured)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.kind = "cuda_max_allocated" if device.type == "cuda" else "cpu_rss_growth"
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            self.baseline = torch.cuda.memory_allocated(device)
        else:
            self.baseline = resident_bytes()
        self.peak = self.baseline

    def sample(self) -> None:
        if self.device.type != "cuda" and self.baseline is not None:
            self.peak = max(self.peak, resident_bytes() or 0)

    def peak_growth(self) -> Optional[int]:
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device) - self.baseline)
        if self.baseline is None:
            return None
        return int(max(self.peak - self.baseline, 0))


# --- when to evaluate ---------------------------------------------------------------


class EvalMarks:
    """Marks of training progress (steps or seconds) at which to evaluate, in order."""

    def __init__(self, marks: Sequence[float], by: str):
        self.marks, self.by = sorted(marks), by

    @classmethod
    def every_steps(cls, steps: int, count: int) -> "EvalMarks":
        return cls(sorted({max(1, round(steps * i / count)) for i in range(1, count + 1)}), "step")

    @classmethod
    def every_seconds(cls, seconds: float, count: int) -> "EvalMarks":
        return cls([seconds * i / count for i in range(1, count + 1)], "seconds")

    def due(self, step: int, seconds: float) -> bool:
        """True once per passed mark; a step that passes several marks evaluates once."""
        value = step if self.by == "step" else seconds
        passed = False
        while self.marks and value >= self.marks[0]:
            self.marks.pop(0)
            passed = True
        return passed


# --- the speedup maths --------------------------------------------------------------


def time_to_psnr(points: Sequence[dict], threshold: float) -> Optional[float]:
    """Training seconds at which the PSNR curve first reaches `threshold`, interpolating
    linearly between evaluation points; None if it never does."""
    points = sorted((p for p in points if p.get("psnr") is not None), key=lambda p: p["seconds"])
    if not points:
        return None
    if points[0]["psnr"] >= threshold:
        return float(points[0]["seconds"])
    for before, after in zip(points, points[1:]):
        if before["psnr"] < threshold <= after["psnr"]:
            share = (threshold - before["psnr"]) / (after["psnr"] - before["psnr"])
            return float(before["seconds"] + share * (after["seconds"] - before["seconds"]))
    return None


def speedups(points_by_preset: Dict[str, Sequence[dict]], tolerance: float = PSNR_TOLERANCE_DB) -> Dict[str, dict]:
    """For each ordered pair (a, b): the time a needs to come within `tolerance` of b's
    final PSNR, the time b itself first got there, and b's time / a's time (> 1: a is faster).

    Also b's whole run time over a's time (`speedup_vs_run`): how much sooner a has what b
    ends with. The first ratio is stricter but unstable when b's curve is not monotone (a
    densification burst can touch the final level early and then fall back); the second is
    the question "how much less time for the same result"."""
    result: Dict[str, dict] = {}
    for a, points_a in points_by_preset.items():
        result[a] = {}
        for b, points_b in points_by_preset.items():
            if a == b:
                continue
            finals = [p["psnr"] for p in points_b if p.get("psnr") is not None]
            if not finals:
                result[a][b] = None
                continue
            target = finals[-1]
            seconds = time_to_psnr(points_a, target - tolerance)
            reference = time_to_psnr(points_b, target - tolerance)
            run_seconds = max(p["seconds"] for p in points_b)
            # Both at 0 s (the starting point is already within tolerance): no ratio.
            ratio = reference / seconds if seconds and reference is not None else None
            ratio_vs_run = run_seconds / seconds if seconds else None
            result[a][b] = {"target_psnr": target, "threshold_psnr": target - tolerance, "seconds": seconds,
                            "reference_seconds": reference, "speedup": ratio,
                            "reference_run_seconds": run_seconds, "speedup_vs_run": ratio_vs_run}
    return result


# --- one preset ---------------------------------------------------------------------


def finite_or_none(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def evaluation_point(trainer: Trainer, scene: Scene, first: bool, log) -> Tuple[dict, Optional[str]]:
    """The test views' mean metrics now, and the LPIPS backbone (None without LPIPS)."""
    evaluation = evaluate_views(trainer.gaussians, scene.test, trainer.background, log, lpips_note=first)
    point = {"seconds": round(trainer.elapsed, 4), "step": trainer.step}
    for key, value in evaluation["mean"].items():
        point[key] = finite_or_none(value)
    point["num_gaussians"] = len(trainer.gaussians)
    return point, evaluation.get("lpips_backbone")


def preset_config(name: str, settings: BenchSettings) -> TrainConfig:
    """The preset as `turbogs train --preset NAME` runs it with the same --steps or
    --budget-seconds; PRESET@N as it runs with --steps N."""
    base, own_steps = split_steps(name)
    cfg = get_preset(base)
    cfg.seed = settings.seed
    if own_steps is not None:
        return cfg.for_run(steps=own_steps)
    return cfg.for_run(settings.steps, settings.budget_seconds)


def make_trainer(scene: Scene, cfg: TrainConfig, settings: BenchSettings) -> Trainer:
    options = RunOptions(out_dir=settings.out_dir, device=settings.device, evaluate=False, progress=False,
                         log=settings.log)
    return Trainer(scene, cfg, options)


def warm_up(scene: Scene, settings: BenchSettings) -> None:
    """A few untimed steps, so that the first preset alone does not pay for start-up costs
    (CUDA context and kernels, lazy imports, thread pools) in its time and memory."""
    trainer = make_trainer(scene, preset_config(settings.presets[0], settings), settings)
    for _ in range(WARMUP_STEPS):
        trainer.run_step()
    del trainer
    release_memory(settings.device)


def release_memory(device: torch.device) -> None:
    """Free what the last preset left, so that the next one's growth starts from a low base:
    CUDA's cache goes back to the driver, and glibc's free heap pages to the kernel."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    elif sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):  # not glibc
            pass


def run_preset(name: str, scene: Scene, settings: BenchSettings, bar: tqdm, first: bool) -> dict:
    """Train one preset, evaluating at the marks; returns its entry of bench.json."""
    cfg = preset_config(name, settings)
    budget = cfg.budget_seconds  # None: this preset runs a number of steps
    if budget is None:
        marks = EvalMarks.every_steps(cfg.steps, settings.eval_points)
    else:
        marks = EvalMarks.every_seconds(budget, settings.eval_points)

    release_memory(settings.device)
    meter = MemoryMeter(settings.device)
    trainer = make_trainer(scene, cfg, settings)
    meter.sample()
    bar.set_postfix_str(name)
    point, backbone = evaluation_point(trainer, scene, first, settings.log)
    points = [point]
    # The bar counts steps, training seconds or, when presets are sized differently, presets.
    mixed = settings.mixed_sizing
    bar_share = 0 if budget is None else 0.0  # what this preset has advanced the bar by
    while trainer.progress() < 1.0:  # the trainer's own end: its steps, or its time budget
        seconds = trainer.run_step()
        meter.sample()
        if mixed:
            advance = min(trainer.progress(), 1.0) - bar_share
        else:
            advance = 1 if budget is None else min(seconds, budget - bar_share)
        bar.update(advance)
        bar_share += advance
        if marks.due(trainer.step, trainer.elapsed):
            points.append(evaluation_point(trainer, scene, False, settings.log)[0])
            meter.sample()
            bar.write(f"{name}: {points[-1]['seconds']:.1f} s, step {trainer.step}, "
                      f"PSNR {_fmt(points[-1]['psnr'], '.2f')} dB, {points[-1]['num_gaussians']} Gaussians")
    if points[-1]["step"] != trainer.step:
        points.append(evaluation_point(trainer, scene, False, settings.log)[0])
        meter.sample()
    full_share = 1.0 if mixed else cfg.steps if budget is None else budget
    if full_share > bar_share:  # a preset that stopped early still fills its share
        bar.update(full_share - bar_share)

    entry = {
        "points": points,
        "steps": trainer.step,
        "max_steps": cfg.steps,
        "stopped_by": "budget" if budget is not None and trainer.elapsed >= budget else "steps",
        "train_seconds": round(trainer.elapsed, 4),
        "steps_per_second": round(trainer.step / trainer.elapsed, 3) if trainer.elapsed > 0 else None,
        "num_gaussians": len(trainer.gaussians),
        "peak_memory_bytes": meter.peak_growth(),
        "memory_measure": meter.kind,
        "skipped_steps": trainer.stats.skipped_steps,
        "lpips_backbone": backbone,
    }
    del trainer
    release_memory(settings.device)
    return entry


# --- the whole bench ----------------------------------------------------------------


def machine_info(device: torch.device) -> dict:
    info = {"platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def load_bench_scene(settings: BenchSettings) -> Scene:
    from turbogs.data.load import load_scene

    test_every = get_preset(settings.presets[0]).test_every
    scene = load_scene(settings.scene, resolution=settings.resolution, images=settings.images, eval_split=True,
                       white_background=settings.white_background, test_every=test_every, log=settings.log)
    if not scene.test:
        raise InputError(f"{settings.scene}: no test views to evaluate on (every {test_every}th image is one)")
    return scene


def run_bench(settings: BenchSettings) -> dict:
    """Run every preset, write bench.json, bench.md and psnr_vs_time.png; return the result."""
    if settings.steps is None and settings.budget_seconds is None:
        raise InputError("bench: give --budget-seconds S or --steps N (or --step-cost)")
    check_output_dir(settings.out_dir)
    scene = load_bench_scene(settings)
    width, height = scene.train[0].width, scene.train[0].height
    sizing = (f"{settings.steps} steps" if settings.steps is not None
              else f"{settings.budget_seconds:g} s of training time")
    own_steps = settings.preset_steps
    if own_steps:
        sizing += " (" + ", ".join(f"{name}: {steps} steps" for name, steps in own_steps.items()) + ")"
    settings.log(f"bench {settings.scene}: {len(scene.train)} train / {len(scene.test)} test views, "
                 f"{width}x{height} px; presets {', '.join(settings.presets)}, {sizing} each, "
                 f"{settings.eval_points} evaluations, on {settings.device}")
    warm_up(scene, settings)

    if own_steps:
        bar = tqdm(total=len(settings.presets), unit="preset", desc="bench", disable=not settings.progress,
                   dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.2f}/{total} presets [{elapsed}<{remaining}{postfix}]")
    elif settings.steps is not None:
        bar = tqdm(total=settings.steps * len(settings.presets), unit="step", desc="bench",
                   disable=not settings.progress, dynamic_ncols=True)
    else:
        bar = tqdm(total=settings.budget_seconds * len(settings.presets), unit="s", desc="bench",
                   disable=not settings.progress, dynamic_ncols=True,
                   bar_format="{l_bar}{bar}| {n:.1f}/{total:.0f} s train [{elapsed}<{remaining}{postfix}]")
    presets = {}
    try:
        for index, name in enumerate(settings.presets):
            presets[name] = run_preset(name, scene, settings, bar, first=index == 0)
    finally:
        bar.close()

    result = {
        "scene": str(settings.scene),
        "image_size": [width, height],
        "train_views": len(scene.train),
        "test_views": len(scene.test),
        "resolution": settings.resolution,
        "device": str(settings.device),
        "command": settings.command,
        "machine": machine_info(settings.device),
        "seed": settings.seed,
        "mode": dict({"steps": settings.steps} if settings.steps is not None else {"budget_seconds": settings.budget_seconds},
                     **({"preset_steps": own_steps} if own_steps else {})),
        "eval_points": settings.eval_points,
        "psnr_tolerance_db": PSNR_TOLERANCE_DB,
        "presets": presets,
        "speedup": speedups({name: entry["points"] for name, entry in presets.items()}),
    }
    write_outputs(result, settings.out_dir)
    return result


def write_outputs(result: dict, out_dir: Path) -> None:
    atomic_write_json(out_dir / "bench.json", result)
    atomic_write_text(out_dir / "bench.md", markdown_report(result))
    image = draw_psnr_plot(result)
    with atomic_path(out_dir / "psnr_vs_time.png") as tmp:
        if not cv2.imwrite(str(tmp), image):
            raise OSError(f"could not encode {out_dir / 'psnr_vs_time.png'}")


# --- the markdown report ------------------------------------------------------------


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _megabytes(value: Optional[int]) -> str:
    return "-" if value is None else f"{value / 2**20:.0f} MiB"


def markdown_report(result: dict) -> str:
    mode = result["mode"]
    sizing = (f"{mode['steps']} steps per preset (schedules scaled to them)" if "steps" in mode
              else f"a time budget of {mode['budget_seconds']:g} s of training per preset (schedules follow it)")
    if mode.get("preset_steps"):
        sizing += "; " + ", ".join(f"{name} runs {steps} steps instead" for name, steps in mode["preset_steps"].items())
    machine = result["machine"]
    where = machine.get("gpu") or f"{machine['cpu_count']} CPUs, {machine['torch_threads']} torch threads"
    lines = [
        f"# TurboGS bench: {Path(result['scene']).name}",
        "",
        f"- command: `{result['command']}`",
        f"- device: {result['device']} ({where}); torch {machine['torch']}, {machine['platform']}",
        f"- scene: {result['scene']}, {result['train_views']} train / {result['test_views']} test views, "
        f"{result['image_size'][0]}x{result['image_size'][1]} px",
        f"- run: {sizing}; evaluation, set-up and file writes are not counted as training time",
        "",
        "| preset | PSNR (dB) | SSIM | LPIPS | train time (s) | steps | steps/s | Gaussians | peak memory |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, entry in result["presets"].items():
        final = entry["points"][-1]
        lines.append(
            f"| {name} | {_fmt(final.get('psnr'), '.2f')} | {_fmt(final.get('ssim'), '.4f')} | "
            f"{_fmt(final.get('lpips'), '.4f')} | {entry['train_seconds']:.1f} | {entry['steps']} | "
            f"{_fmt(entry['steps_per_second'], '.2f')} | {entry['num_gaussians']} | "
            f"{_megabytes(entry['peak_memory_bytes'])} |"
        )
    memory = {entry["memory_measure"] for entry in result["presets"].values()}
    lines += ["", f"Peak memory: {', '.join(sorted(memory))} (growth over the memory in use before the preset)."]

    pairs = [(a, b, s) for a, row in result["speedup"].items() for b, s in row.items() if s is not None]
    if pairs:
        lines += [
            "",
            f"## Time to reach the other preset's final PSNR (within {result['psnr_tolerance_db']} dB)",
            "",
            "The reference's time is when it *first* came within the tolerance of its own final PSNR;",
            "its run is all of its training. Speedup = reference's time / preset's time; vs run =",
            "reference's run / preset's time (how much sooner the preset has what the reference ends with).",
            "",
            "| preset | reference | target PSNR (dB) | preset's time (s) | reference's time (s) | speedup "
            "| reference's run (s) | speedup vs run |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for a, b, s in pairs:
            speedup = ("never reached" if s["seconds"] is None
                       else "-" if s["speedup"] is None else f"{s['speedup']:.2f}x")
            vs_run = "-" if s.get("speedup_vs_run") is None else f"{s['speedup_vs_run']:.2f}x"
            lines.append(f"| {a} | {b} | {s['target_psnr']:.2f} | {_fmt(s['seconds'], '.1f')} | "
                         f"{_fmt(s['reference_seconds'], '.1f')} | {speedup} | "
                         f"{_fmt(s.get('reference_run_seconds'), '.1f')} | {vs_run} |")

    lines += ["", "## Evaluation points", "", "| preset | train time (s) | step | PSNR (dB) | SSIM | Gaussians |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, entry in result["presets"].items():
        for p in entry["points"]:
            lines.append(f"| {name} | {p['seconds']:.2f} | {p['step']} | {_fmt(p.get('psnr'), '.2f')} | "
                         f"{_fmt(p.get('ssim'), '.4f')} | {p['num_gaussians']} |")
    return "\n".join(lines) + "\n"


# --- the plot -----------------------------------------------------------------------

PLOT_SIZE = (960, 600)  # width, height in pixels
PLOT_MARGINS = (90, 30, 50, 80)  # left, right, top, bottom
# Tableau's colors, as BGR for OpenCV.
CURVE_COLORS = [(180, 119, 31), (14, 127, 255), (44, 160, 44), (40, 39, 214), (189, 103, 148), (75, 86, 140)]
FONT = cv2.FONT_HERSHEY_SIMPLEX


def nice_ticks(low: float, high: float, count: int = 6) -> List[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [low, high]."""
    if not high > low:
        low, high = low - 0.5, high + 0.5
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    # A run stopped by a time budget ends a hair past it (150.14 s of 150): within 1 % of a
    # step (about a pixel) counts as on the tick, rather than adding a tick of empty axis.
    first, last = math.floor(low / step + 0.01), math.ceil(high / step - 0.01)
    return [round(i * step, 10) for i in range(first, last + 1)]


def _tick_label(value: float, ticks: List[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def _put_centered(image, text, center_x, baseline_y, scale=0.5, thickness=1, color=(0, 0, 0)):
    (w, _), _ = cv2.getTextSize(text, FONT, scale, thickness)
    cv2.putText(image, text, (int(center_x - w / 2), int(baseline_y)), FONT, scale, color, thickness, cv2.LINE_AA)


def draw_psnr_plot(result: dict) -> np.ndarray:
    """Test PSNR against training seconds, one curve per preset: a BGR uint8 image."""
    width, height = PLOT_SIZE
    left, right, top, bottom = PLOT_MARGINS
    image = np.full((height, width, 3), 255, np.uint8)
    curves = {name: [(p["seconds"], p["psnr"]) for p in entry["points"] if p.get("psnr") is not None]
              for name, entry in result["presets"].items()}
    xs = [x for curve in curves.values() for x, _ in curve] or [0.0, 1.0]
    ys = [y for curve in curves.values() for _, y in curve] or [0.0, 1.0]
    x_ticks = nice_ticks(0.0, max(max(xs), 1e-3))
    y_ticks = nice_ticks(min(ys), max(ys))
    x0, x1, y0, y1 = x_ticks[0], x_ticks[-1], y_ticks[0], y_ticks[-1]

    def to_pixel(x: float, y: float):
        px = left + (x - x0) / (x1 - x0) * (width - left - right)
        py = height - bottom - (y - y0) / (y1 - y0) * (height - top - bottom)
        return int(round(px)), int(round(py))

    # Grid, ticks and tick labels.
    for x in x_ticks:
        px, _ = to_pixel(x, y0)
        cv2.line(image, (px, top), (px, height - bottom), (225, 225, 225), 1)
        cv2.line(image, (px, height - bottom), (px, height - bottom + 5), (0, 0, 0), 1)
        _put_centered(image, _tick_label(x, x_ticks), px, height - bottom + 22)
    for y in y_ticks:
        _, py = to_pixel(x0, y)
        cv2.line(image, (left, py), (width - right, py), (225, 225, 225), 1)
        cv2.line(image, (left - 5, py), (left, py), (0, 0, 0), 1)
        label = _tick_label(y, y_ticks)
        (w, h), _ = cv2.getTextSize(label, FONT, 0.5, 1)
        cv2.putText(image, label, (left - 9 - w, py + h // 2), FONT, 0.5, (0, 0, 0), 1, cv2.LINE_AA)
    cv2.rectangle(image, (left, top), (width - right, height - bottom), (0, 0, 0), 1)

    # Axis labels and title; the y label is drawn on its own strip and rotated.
    _put_centered(image, "training time (s)", (left + width - right) / 2, height - 22, scale=0.6)
    strip = np.full((30, height - top - bottom, 3), 255, np.uint8)
    _put_centered(strip, "test PSNR (dB)", strip.shape[1] / 2, 21, scale=0.6)
    strip = cv2.rotate(strip, cv2.ROTATE_90_COUNTERCLOCKWISE)
    image[top:top + strip.shape[0], 8:8 + strip.shape[1]] = strip
    title = f"{Path(result['scene']).name}: test PSNR vs training time ({result['device']})"
    _put_centered(image, title, width / 2, 32, scale=0.65)

    # Curves with a marker at every evaluation, then the legend (lower right).
    for index, (name, curve) in enumerate(curves.items()):
        color = CURVE_COLORS[index % len(CURVE_COLORS)]
        pixels = np.array([to_pixel(x, y) for x, y in curve], np.int32)
        if len(pixels) > 1:
            cv2.polylines(image, [pixels.reshape(-1, 1, 2)], False, color, 2, cv2.LINE_AA)
        for px, py in pixels:
            cv2.circle(image, (int(px), int(py)), 4, color, -1, cv2.LINE_AA)
    names = list(curves)
    if names:
        text_width = max(cv2.getTextSize(n, FONT, 0.55, 1)[0][0] for n in names)
        box_w, box_h = text_width + 60, 24 * len(names) + 12
        bx, by = width - right - box_w - 10, height - bottom - box_h - 10
        cv2.rectangle(image, (bx, by), (bx + box_w, by + box_h), (255, 255, 255), -1)
        cv2.rectangle(image, (bx, by), (bx + box_w, by + box_h), (120, 120, 120), 1)
        for index, name in enumerate(names):
            color = CURVE_COLORS[index % len(CURVE_COLORS)]
            cy = by + 18 + 24 * index
            cv2.line(image, (bx + 8, cy), (bx + 38, cy), color, 2, cv2.LINE_AA)
            cv2.circle(image, (bx + 23, cy), 4, color, -1, cv2.LINE_AA)
            cv2.putText(image, name, (bx + 46, cy + 5), FONT, 0.55, (0, 0, 0), 1, cv2.LINE_AA)
    return image


# --- step cost ----------------------------------------------------------------------


def replicated_gaussians(base: Gaussians, count: int, generator: torch.Generator) -> Gaussians:
    """`count` Gaussians cloned at random from `base`: a stand-in for a densified model.
    Each clone's center is jittered by its own size, and sizes shrink by
    (count / len(base))^(1/3) so that the clones cover about the space the originals did."""
    rows = torch.randint(len(base), (count,), generator=generator)
    params = {name: value.detach()[rows].clone() for name, value in base.raw().items()}
    shrink = math.log((count / len(base)) ** (1 / 3)) if count > len(base) else 0.0
    jitter = torch.randn(count, 3, generator=generator) * params["scales"].exp()
    params["means"] = params["means"] + jitter
    params["scales"] = params["scales"] - shrink
    return Gaussians(params, base.sh_degree, base.active_sh_degree)


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
    bands are active, as late in training. With `profile`, torch.profiler's table of the
    costliest ops of a few full and quarter steps goes to profile.txt.
    """
    from turbogs.render import render
    from turbogs.tiles import tile_grid
    from turbogs.turbo.losses import TileLoss

    check_output_dir(settings.out_dir)
    scene = load_bench_scene(settings)
    device = settings.device
    cfg = get_preset(settings.presets[0])
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
        "machine": machine_info(device),
        "command": settings.command,
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
        write_profile(settings.out_dir / "profile.txt", lambda f: one_step(camera, camera.image.to(device), masks[f]),
                      device, f"{len(gaussians)} Gaussians, {camera.width}x{camera.height} px")
    settings.log(f"step cost on {device}, {len(gaussians)} Gaussians, {result['image_size'][0]}x"
                 f"{result['image_size'][1]} px, median of {repeats}:")
    for f in STEP_COST_FRACTIONS:
        settings.log(f"  {f:>4.0%} of tiles ({tiles[f]}/{total_tiles}): {medians[f] * 1e3:8.2f} ms/step, "
                     f"{medians[f] / medians[1.0]:.2f}x the full step")
    settings.log(f"wrote {settings.out_dir / 'step_cost.json'}" + (" and profile.txt" if profile else ""))
    return result


def write_profile(path: Path, step: Callable[[float], float], device: torch.device, what: str,
                  steps: int = 3, rows: int = 25) -> None:
    """torch.profiler's costliest ops (self time on the device, else on the CPU) over a
    few steps with all tiles and with a quarter of them."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    sections = [f"render + tile loss + backward on {device}, {what}; {steps} steps each, sorted by {sort_by}"]
    for fraction in (1.0, 0.25):
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step(fraction)
        sections.append(f"== {fraction:.0%} of tiles\n" + prof.key_averages().table(sort_by=sort_by, row_limit=rows))
    atomic_write_text(path, "\n\n".join(sections) + "\n")


# --- command line -------------------------------------------------------------------


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add `bench` to the `turbogs` command line (subparsers of cli.build_parser)."""
    from turbogs.cli import add_device, positive_float, positive_int, resolution_arg

    p = subparsers.add_parser(
        "bench", help="train presets side by side and compare their time to quality",
        description="Train each preset on the same scene and split, evaluate the test views at fixed points of "
                    "training time, and write bench.json, bench.md and psnr_vs_time.png.")
    p.add_argument("scene", help="capture folder (COLMAP or transforms.json); every 8th image is a test view")
    p.add_argument("--presets", default=",".join(PRESETS),
                   help=f"comma-separated presets to compare, run in this order (default: {','.join(PRESETS)}); "
                        f"PRESET+ABLATION switches one part off, e.g. turbo+no-ncc "
                        f"(ablations: {', '.join(ABLATIONS)}); PRESET@N runs N steps whatever the "
                        f"budget, e.g. turbo,3dgs@7000 races turbo's budget against 3dgs at 7k steps")
    sizing = p.add_mutually_exclusive_group()
    sizing.add_argument("--budget-seconds", type=positive_float, metavar="S",
                        help="give each preset a time budget of S seconds of training (as train --budget-seconds)")
    sizing.add_argument("--steps", type=positive_int, metavar="N",
                        help="train each preset for N steps, without a time budget (as train --steps)")
    p.add_argument("-r", "--resolution", type=resolution_arg,
                   help="downscale factor 1|2|4|8, or a target width in px (default: full size, capped at 1600 px)")
    p.add_argument("--images", default="images", help="image folder inside the capture (default: images)")
    p.add_argument("--white-background", "-w", action="store_true", help="composite RGBA images on white")
    add_device(p)
    p.add_argument("--seed", type=int, default=0, help="random seed, the same for every preset (default 0)")
    p.add_argument("--eval-points", type=positive_int, default=8,
                   help="evaluations on the test views during each run, evenly spaced (default 8)")
    p.add_argument("--out", "-o", required=True, help="folder for bench.json, bench.md and psnr_vs_time.png")
    p.add_argument("--step-cost", action="store_true",
                   help="instead: seconds per render+loss+backward at 100%%, 50%% and 25%% of tiles (step_cost.json)")
    p.add_argument("--step-cost-repeats", type=positive_int, default=7, help="repeats per fraction (default 7)")
    p.add_argument("--step-cost-gaussians", type=positive_int, metavar="N",
                   help="with --step-cost: clone the initial Gaussians up to N (default: the initial ones)")
    p.add_argument("--step-cost-profile", action="store_true",
                   help="with --step-cost: also write torch.profiler's costliest ops to profile.txt")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)
    return p


def cmd_bench(args: argparse.Namespace) -> int:
    from turbogs.cli import pick_device

    argv = args.argv
    if args.step_cost and (args.steps is not None or args.budget_seconds is not None):
        raise InputError("bench: --step-cost measures single steps; drop --steps / --budget-seconds")
    settings = BenchSettings(
        scene=Path(args.scene), presets=parse_presets(args.presets), out_dir=Path(args.out),
        steps=args.steps, budget_seconds=args.budget_seconds,
        resolution=args.resolution, images=args.images, white_background=args.white_background,
        device=pick_device(args.device, args.threads), seed=args.seed, eval_points=args.eval_points, progress=not args.quiet,
        command="turbogs " + shlex.join(argv),
    )
    if args.step_cost:
        run_step_cost(settings, repeats=args.step_cost_repeats, num_gaussians=args.step_cost_gaussians,
                      profile=args.step_cost_profile)
        return 0
    result = run_bench(settings)
    for name, entry in result["presets"].items():
        final = entry["points"][-1]
        print(f"{name}: PSNR {final['psnr']:.2f} dB, SSIM {final['ssim']:.4f} after {entry['train_seconds']:.1f} s "
              f"({entry['steps']} steps, {entry['steps_per_second']} steps/s), {entry['num_gaussians']} Gaussians")
    for a, row in result["speedup"].items():
        for b, s in row.items():
            if s is None:
                continue
            target = f"{b}'s final {s['target_psnr']:.2f} dB (within {PSNR_TOLERANCE_DB} dB)"
            if s["seconds"] is None:
                print(f"{a} never reached {target}")
            elif s["speedup"] is None:
                print(f"{a} and {b} were both there at the start: {target}")
            else:
                print(f"{a} reached {target} in {s['seconds']:.1f} s, {b} first in {s['reference_seconds']:.1f} s "
                      f"({s['speedup']:.2f}x) of its {s['reference_run_seconds']:.1f} s ({s['speedup_vs_run']:.2f}x)")
    print(f"wrote {settings.out_dir / 'bench.json'}, bench.md and psnr_vs_time.png")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    """`python -m turbogs.bench SCENE ...`: the bench command on its own."""
    from turbogs.cli import main as cli_main

    return cli_main(["bench", *map(str, sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
