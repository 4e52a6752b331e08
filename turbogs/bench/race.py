"""`turbogs bench`, one preset after another: the runs, timed and metered, and their records
(bench.json, then bench.md and the plot via report.py and plot.py). See the package docstring."""

from __future__ import annotations

import ctypes
import gc
import math
import os
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import cv2
import torch
from tqdm import tqdm

from turbogs import kernels
from turbogs.bench.counts import GaussianCounts
from turbogs.bench.plot import draw_psnr_plot
from turbogs.bench.report import PSNR_TOLERANCE_DB, fmt, markdown_report, speedups
from turbogs.bench.settings import apply_settings, config_record
from turbogs.data.scene import Scene
from turbogs.errors import InputError
from turbogs.evaluate import evaluate_views
from turbogs.fileio import atomic_path, atomic_write_json, atomic_write_text
from turbogs.training.config import TrainConfig, get_preset
from turbogs.training.outdir import check_output_dir
from turbogs.training.trainer import SessionOptions, Trainer

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
    batch_views: int = 1  # views per optimizer step (the bench runs one process: world_size 1)
    eval_points: int = 8
    progress: bool = True
    command: str = ""
    log: Callable[[str], None] = print
    # --set FIELD=VALUE, on every preset in this order before the run is sized (bench/settings.py)
    config_settings: Tuple[str, ...] = ()
    scene_name: str = ""  # the scene spec's NAME, for the report's title; "": the folder's name

    def __post_init__(self):
        if self.steps is not None and self.budget_seconds is not None:
            raise InputError("bench: give either --steps N or --budget-seconds S, not both")
        if not self.presets:
            raise InputError("bench: --presets names no preset")
        duplicates = sorted({name for name in self.presets if self.presets.count(name) > 1})
        if duplicates:
            raise InputError(f"bench: preset {duplicates[0]!r} is listed twice in --presets")
        for name in self.presets:
            base_config(name, self)  # raises naming the known presets, or the setting that does not apply

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


def base_config(name: str, settings: BenchSettings) -> TrainConfig:
    """The preset with the bench's seed, views per step and --set settings, not yet sized."""
    cfg = get_preset(split_steps(name)[0])
    cfg.seed = settings.seed
    cfg.batch_views = settings.batch_views
    return apply_settings(cfg, settings.config_settings)


def preset_config(name: str, settings: BenchSettings) -> TrainConfig:
    """The preset as `turbogs train --preset NAME` runs it with the same --steps or
    --budget-seconds; PRESET@N as it runs with --steps N. --set settings come before the sizing,
    so that a changed schedule is scaled like the preset's own."""
    own_steps = split_steps(name)[1]
    cfg = base_config(name, settings)
    if own_steps is not None:
        return cfg.for_run(steps=own_steps)
    return cfg.for_run(settings.steps, settings.budget_seconds)


def make_trainer(scene: Scene, cfg: TrainConfig, settings: BenchSettings) -> Trainer:
    options = SessionOptions(out_dir=settings.out_dir, device=settings.device, evaluate=False, progress=False,
                         log=settings.log)
    return Trainer(scene, cfg, options)


def warm_up(scene: Scene, settings: BenchSettings) -> None:
    """A few untimed steps, so that the first preset alone does not pay for start-up costs
    (CUDA context and kernels, lazy imports, thread pools) in its time and memory."""
    trainer = make_trainer(scene, preset_config(settings.presets[0], settings), settings)
    for _ in range(WARMUP_STEPS):
        trainer.timed_step()
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
    counts = GaussianCounts(len(trainer.gaussians))
    trainer.observer = counts
    meter.sample()
    bar.set_postfix_str(name)
    point, backbone = evaluation_point(trainer, scene, first, settings.log)
    points = [point]
    # The bar counts steps, training seconds or, when presets are sized differently, presets.
    mixed = settings.mixed_sizing
    bar_share = 0 if budget is None else 0.0  # what this preset has advanced the bar by
    while trainer.progress() < 1.0:  # the trainer's own end: its steps, or its time budget
        seconds = trainer.timed_step()
        counts.after_step(trainer.step, trainer.elapsed)
        meter.sample()
        if mixed:
            advance = min(trainer.progress(), 1.0) - bar_share
        else:
            advance = 1 if budget is None else min(seconds, budget - bar_share)
        bar.update(advance)
        bar_share += advance
        if marks.due(trainer.step, trainer.elapsed):
            trainer.read_device_figures()  # skipped steps; a diverged run stops here
            points.append(evaluation_point(trainer, scene, False, settings.log)[0])
            meter.sample()
            bar.write(f"{name}: {points[-1]['seconds']:.1f} s, step {trainer.step}, "
                      f"PSNR {fmt(points[-1]['psnr'], '.2f')} dB, {points[-1]['num_gaussians']} Gaussians")
    if points[-1]["step"] != trainer.step:
        points.append(evaluation_point(trainer, scene, False, settings.log)[0])
        meter.sample()
    full_share = 1.0 if mixed else cfg.steps if budget is None else budget
    if full_share > bar_share:  # a preset that stopped early still fills its share
        bar.update(full_share - bar_share)

    trainer.read_device_figures()
    entry = {
        "points": points,
        "steps": trainer.step,
        "max_steps": cfg.steps,
        "stopped_by": "budget" if budget is not None and trainer.elapsed >= budget else "steps",
        "train_seconds": round(trainer.elapsed, 4),
        "steps_per_second": round(trainer.step / trainer.elapsed, 3) if trainer.elapsed > 0 else None,
        # steps count optimizer steps: views trained = steps x world_size x batch_views
        "world_size": trainer.world.size,
        "batch_views": cfg.batch_views,
        "num_gaussians": len(trainer.gaussians),
        "peak_gaussians": counts.peak,
        "gaussian_counts": counts.events,  # the start, then every densification or change of count
        "peak_memory_bytes": meter.peak_growth(),
        "memory_measure": meter.kind,
        "skipped_steps": trainer.stats.skipped_steps,
        "lpips_backbone": backbone,
        "config": config_record(trainer.cfg),  # what the trainer ran: the preset, the settings, the sizing
    }
    del trainer
    release_memory(settings.device)
    return entry


# --- the whole bench ----------------------------------------------------------------


def cpu_model_name() -> str:
    """The CPU's model name as lscpu gives it (/proc/cpuinfo's "model name"), or the platform's
    word for the processor where there is no such file."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info(device: torch.device) -> dict:
    info = {"platform": platform.platform(), "cpu": cpu_model_name(), "python": platform.python_version(),
            "torch": torch.__version__, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
    return info


def load_bench_scene(settings: BenchSettings) -> Scene:
    from turbogs.data.load import load_scene

    test_every = base_config(settings.presets[0], settings).test_every
    scene = load_scene(settings.scene, resolution=settings.resolution, images=settings.images, eval_split=True,
                       white_background=settings.white_background, test_every=test_every, log=settings.log)
    if not scene.test:
        raise InputError(f"{settings.scene}: no test views to evaluate on (every {test_every}th image is one)")
    return scene


def race_presets(settings: BenchSettings) -> dict:
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
                 f"{settings.eval_points} evaluations, on {settings.device}"
                 + (f"; settings {' '.join(settings.config_settings)}" if settings.config_settings else ""))
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
        **({"scene_name": settings.scene_name} if settings.scene_name else {}),
        "image_size": [width, height],
        "train_views": len(scene.train),
        "test_views": len(scene.test),
        "resolution": settings.resolution,
        "white_background": settings.white_background,
        "device": str(settings.device),
        "backend": kernels.backend_name(settings.device),
        "command": settings.command,
        "machine": machine_info(settings.device),
        "seed": settings.seed,
        "settings": list(settings.config_settings),
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
