"""What a run starts from: the Gaussians, from the capture's points or points along the camera
rays (as many as the run affords), and their optimizers, one per parameter as INRIA's groups."""

from __future__ import annotations

from typing import Callable, Dict

import torch

from turbogs.data.scene import Scene
from turbogs.gaussians import PARAM_NAMES, Gaussians
from turbogs.training.config import TrainConfig
from turbogs.training.init_points import initial_points
from turbogs.training.init_size import initial_count


def initial_gaussians(scene: Scene, cfg: TrainConfig, generator: torch.Generator, device_type: str = "cpu",
                      log: Callable[[str], None] = print) -> Gaussians:
    """From the capture's points where there are some, else from points along the camera rays,
    as many as the run can afford (training/init_size.py)."""
    count, why = initial_count(scene, cfg.init_random_points, device_type, cfg.budget_seconds,
                               getattr(cfg.density, "max_gaussians", None))
    points, colors = initial_points(scene, count, generator, log, why, cfg.background_points)
    gaussians = Gaussians.from_points(torch.from_numpy(points), torch.from_numpy(colors), cfg.sh_degree)
    gaussians.antialiased = cfg.antialiased  # trained as it will be rendered
    return gaussians


def make_optimizers(gaussians: Gaussians, cfg: TrainConfig, extent: float) -> Dict[str, torch.optim.Optimizer]:
    """One optimizer per parameter, as INRIA's groups, so density control can edit each one's
    rows (the configured optimizer, with INRIA's rates)."""
    rates = {"means": cfg.lr.means * extent, "scales": cfg.lr.scales, "quats": cfg.lr.quats,
             "opacities": cfg.lr.opacities, "sh0": cfg.lr.sh0, "shN": cfg.lr.shN}
    return cfg.optimizer.build({name: gaussians.params[name] for name in PARAM_NAMES}, rates)
