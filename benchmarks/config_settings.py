"""FIELD=VALUE settings on a TrainConfig, for the benchmark scripts that try a variant of a preset
(config_variants.py, antialias.py): dotted paths reach into its parts (`density.opacity_decay=0.6`),
values are Python literals, and `density=NAME` / `optimizer=NAME` swap a part for another at its
defaults."""

from __future__ import annotations

import ast
from typing import Iterable


def apply_settings(cfg, items: Iterable[str]):
    """Set each FIELD=VALUE of `items` on `cfg` (in place; returned); KeyError names a field, or a
    density or optimizer, that does not exist."""
    from turbogs.training.config import DENSITY_CONFIGS, OPTIMIZER_CONFIGS

    for item in items:
        name, _, text = item.partition("=")
        if name in ("density", "optimizer"):
            kinds = DENSITY_CONFIGS if name == "density" else OPTIMIZER_CONFIGS
            if text not in kinds:
                raise KeyError(f"no {name} '{text}' (choose from: {', '.join(kinds)})")
            setattr(cfg, name, kinds[text]())
            continue
        *parents, last = name.split(".")
        target = cfg
        for parent in parents:
            target = getattr(target, parent)
        if not hasattr(target, last):
            raise KeyError(f"no setting {name}")
        setattr(target, last, ast.literal_eval(text))
    return cfg
