"""A trainer placed inside a run, from exactly N Gaussians: what measurements of single
training steps share (`turbogs bench --step-cost-profile`, benchmarks/cpu_native_step.py and
cpu_kernels_ab.py).

A step's cost depends on the Gaussian count and on where in the run it is (turbo renders
every tile early and a quarter of them late), and a fresh run reaches neither a large count
nor a late step without minutes of training. So the capture's points are dropped and the
trainer starts from exactly N points along the camera rays (`init_random_points`), in a run of
RUN_STEPS steps whose step counter is moved to `progress` of it: every schedule (the share of
tiles, SH degree, learning rates) is where that point of a run has it, and nothing else of a
trained model is pretended, unless a trained model's Gaussians are given (`start`): then the
trainer starts from them, cloned up to N (`replicated_gaussians`), so that the sizes, opacities
and overlap a step works through are a real model's. Coarse to fine is off: every step renders
at the requested size, so that steps at different points of a run differ in what they render,
not in how many pixels the images have.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Optional

import torch

from turbogs.data.scene import Scene
from turbogs.gaussians import Gaussians
from turbogs.training.config import TrainConfig
from turbogs.training.trainer import SessionOptions, Trainer

RUN_STEPS = 1000  # the schedules' length; `progress` places the step in it


def without_points(scene: Scene) -> Scene:
    """The scene with its points dropped (in place, returned), so that the start count is ours."""
    scene.points = None
    scene.point_colors = None
    return scene


def trainer_at(scene: Scene, cfg: TrainConfig, count: int, progress: float, out_dir: Path,
               device: torch.device = torch.device("cpu"),
               log: Callable[[str], None] = lambda message: None, start: Optional[Gaussians] = None) -> Trainer:
    """A trainer of `cfg` (not yet sized) starting from `count` ray points of a points-free
    `scene`, or from `start` cloned to `count`, at step progress x RUN_STEPS of a RUN_STEPS-step run."""
    if scene.points is not None:
        raise ValueError("trainer_at starts from ray points: pass without_points(scene)")
    cfg = dataclasses.replace(cfg, init_random_points=count,
                              coarse_to_fine=dataclasses.replace(cfg.coarse_to_fine, enabled=False))
    cfg = cfg.for_run(steps=RUN_STEPS)
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=out_dir, device=device, evaluate=False, progress=False, log=log))
    if start is not None:
        clones = replicated_gaussians(start, count, torch.Generator().manual_seed(cfg.seed))
        with torch.no_grad():  # same rows, so every optimizer's and the strategy's state still fits
            for name, param in trainer.gaussians.params.items():
                param.copy_(clones.params[name].to(param))
    trainer.step = int(progress * RUN_STEPS)
    return trainer


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
    return Gaussians(params, base.sh_degree, base.active_sh_degree, antialiased=base.antialiased)
