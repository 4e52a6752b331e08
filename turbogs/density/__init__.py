"""Density control: which Gaussians exist.

- `rows`: the row operations (append, remove, duplicate, split, set values) that keep
  every optimizer's state and any other per-Gaussian state in step with the parameters.
  Every change to the set of Gaussians, by any strategy, goes through them.
- `vanilla`: INRIA's 3DGS clone / split / prune / opacity-reset schedule.
"""

from turbogs.density.rows import append_rows, duplicate, rebuild_rows, remove_rows, set_values, split
from turbogs.density.vanilla import VanillaDensity, VanillaDensityConfig, reset_opacity

__all__ = [
    "append_rows",
    "duplicate",
    "rebuild_rows",
    "remove_rows",
    "set_values",
    "split",
    "VanillaDensity",
    "VanillaDensityConfig",
    "reset_opacity",
]
