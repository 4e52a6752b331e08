"""Resumable training state: rotating, atomic, verified checkpoints.

A checkpoint holds everything the loop needs to continue bit-for-bit where it
stopped: parameters, optimizer moments, density and sampler state, RNG states,
step and elapsed time. The newest two are kept; a corrupt newest one falls back to
the one before it, with a warning, so a `kill -9` during a save costs nothing.

Trust: a checkpoint is loaded as data only (`torch.load(weights_only=True)`), never as
arbitrary pickle. Everything TurboGS stores is tensors, numbers, strings, lists and dicts
(random generator states are byte tensors), so its own checkpoints, old ones included,
load unchanged. A file that holds any other Python object could run code while being
unpickled: it is refused, named in one line, and the previous checkpoint is tried as
for a torn one.
"""

from __future__ import annotations

import pickle
import re
import warnings
from pathlib import Path
from typing import Callable, List, Optional, Tuple

import torch

from turbogs.errors import TurboGSError
from turbogs.fileio import atomic_path

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
    # Through a Python file, not a path, so that a full disk is an OSError (ENOSPC), which
    # atomic_path turns into one line; torch's own file writer reports only a RuntimeError about
    # positions, and its zip writer still raises one while closing after the OSError: the OSError
    # behind it is what the user needs to read.
    with atomic_path(path) as tmp, open(tmp, "wb") as file:
        try:
            torch.save({"format": FORMAT_VERSION, "step": step, **state}, file)
        except RuntimeError as exc:
            cause = _os_error_behind(exc)
            if cause is None:
                raise
            raise cause from None
    for _, old in list_checkpoints(model_dir)[KEEP:]:
        old.unlink(missing_ok=True)
    return path


def _os_error_behind(exc: Optional[BaseException]) -> Optional[OSError]:
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__context__
    return exc


def remove_checkpoints(model_dir: Path) -> None:
    for _, path in list_checkpoints(model_dir):
        path.unlink(missing_ok=True)


class UnusableCheckpoint(Exception):
    """A checkpoint file that cannot be resumed from; the message says why, in one line."""


def _refusal(path: Path) -> str:
    """Why weights_only refused `path`, naming the foreign globals when the archive can be
    scanned for them (that scan reads pickle opcodes; it unpickles nothing)."""
    try:
        names = sorted(set(torch.serialization.get_unsafe_globals_in_checkpoint(path)))
    except Exception:  # not a torch zip archive, e.g. a bare pickle
        names = []
    if names:
        return f"checkpoint {path} holds Python objects other than tensors and plain data ({', '.join(names)})"
    return f"checkpoint {path} is not plain tensor data as TurboGS writes it"


def read_checkpoint(path: Path, step: int) -> dict:
    """Load one checkpoint as plain data, or raise UnusableCheckpoint."""
    try:
        with warnings.catch_warnings():  # torch's notes on odd pickle protocols: our one line says enough
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # weights_only met something other than tensors and plain data
        raise UnusableCheckpoint(f"{_refusal(path)}; refused, since loading it could run code") from None
    except Exception as exc:  # torn mid-write, truncated, or not a checkpoint at all
        raise UnusableCheckpoint(f"checkpoint {path} is unreadable ({type(exc).__name__})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT_VERSION or state.get("step") != step \
            or "params" not in state:
        raise UnusableCheckpoint(f"checkpoint {path} is unreadable (unexpected contents)")
    return state


def load_latest_checkpoint(model_dir: Path, warn: Callable[[str], None] = print) -> Optional[dict]:
    """The newest checkpoint that loads and checks out, or None when there is none.
    A torn or refused one falls back to the one before it, with a warning; when every
    checkpoint there is unusable, that is a one-line TurboGSError."""
    found = list_checkpoints(model_dir)
    for index, (step, path) in enumerate(found):
        try:
            return read_checkpoint(path, step)
        except UnusableCheckpoint as exc:
            if index + 1 < len(found):
                warn(f"warning: {exc}; trying the previous one")
            else:
                older = "no checkpoint before it loads either" if index else "there is no older checkpoint"
                raise TurboGSError(f"cannot resume: {exc}, and {older} (delete it, or train without --resume)") from None
    return None
