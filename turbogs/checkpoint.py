"""Resumable training state: rotating, atomic, verified checkpoints.

A checkpoint holds everything the loop needs to continue bit-for-bit where it
stopped: parameters, optimizer moments, density and sampler state, RNG states,
step and elapsed time. The newest two are kept; a corrupt newest one falls back to
the one before it, with a warning, so a `kill -9` during a save costs nothing.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch

from turbogs.atomic import atomic_path

KEEP = 2
FORMAT_VERSION = 1


def checkpoint_dir(model_dir: Path) -> Path:
    return Path(model_dir) / "checkpoints"


def list_checkpoints(model_dir: Path) -> List[Tuple[int, Path]]:
    """(step, path) pairs, newest first."""
    found = []
    for path in checkpoint_dir(model_dir).glob("step_*.pt"):
        match = re.fullmatch(r"step_(\d+)\.pt", path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


def save_checkpoint(model_dir: Path, step: int, state: dict) -> Path:
    folder = checkpoint_dir(model_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step:07d}.pt"
    with atomic_path(path) as tmp:
        torch.save({"format": FORMAT_VERSION, "step": step, **state}, tmp)
    for _, old in list_checkpoints(model_dir)[KEEP:]:
        old.unlink(missing_ok=True)
    return path


def remove_checkpoints(model_dir: Path) -> None:
    for _, path in list_checkpoints(model_dir):
        path.unlink(missing_ok=True)


def load_latest_checkpoint(model_dir: Path, warn: Callable[[str], None] = print) -> Optional[dict]:
    """The newest checkpoint that loads and checks out, or None when there is none."""
    for step, path in list_checkpoints(model_dir):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
            if state.get("format") != FORMAT_VERSION or state.get("step") != step or "params" not in state:
                raise ValueError("unexpected contents")
            return state
        except Exception as exc:  # a torn or foreign file: try the previous one
            warn(f"warning: checkpoint {path} is unreadable ({type(exc).__name__}); trying the previous one")
    return None
