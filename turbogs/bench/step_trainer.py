"""A trainer placed inside a run, from exactly N Gaussians: what measurements of single
training steps share (`turbogs bench --step-cost-profile`, benchmarks/cpu_native_step.py and
cpu_kernels_ab.py).

A step's cost depends on the Gaussian count and on where in the run it is (turbo renders
every tile early and a quarter of them late), and a fresh run reaches neither a large count
nor a late step without minutes of training. So the capture's points are dropped and the
trainer starts from exactly N points along the camera rays (`init_random_points`), in a run of
RUN_STEPS steps whose step counter is moved to `progress` of it: every schedule (the share of
tiles, SH degree, learning rates) is where that point of a run has it, and nothing else of a
trained model is pretended.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch

from turbogs.data.scene import Scene
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
               log: Callable[[str], None] = lambda message: None) -> Trainer:
    """A trainer of `cfg` (not yet sized) starting from `count` ray points of a points-free
    `scene`, at step progress x RUN_STEPS of a RUN_STEPS-step run."""
    if scene.points is not None:
        raise ValueError("trainer_at starts from ray points: pass without_points(scene)")
    cfg = dataclasses.replace(cfg, init_random_points=count).for_run(steps=RUN_STEPS)
    trainer = Trainer(scene, cfg, SessionOptions(out_dir=out_dir, device=device, evaluate=False, progress=False, log=log))
    trainer.step = int(progress * RUN_STEPS)
    return trainer
