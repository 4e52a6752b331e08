"""Open what `turbogs view` is pointed at: an INRIA-layout model folder or a bare .ply.

    MODEL/point_cloud/iteration_N/point_cloud.ply   the Gaussians (highest N wins)
    MODEL/cameras.json                              training cameras (optional)
    MODEL/cfg_args                                  source_path + images: where the
                                                    training images are (optional)

A .ply given directly inside such a folder (MODEL/point_cloud/iteration_N/point_cloud.ply)
still finds its cameras. Missing cameras or images are not errors: the model opens
without frustums or thumbnails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np

from turbogs.errors import InputError, TurboGSError
from turbogs.formats import READABLE_SUFFIXES, read_gaussians
from turbogs.formats.model_folder import find_model_ply, model_antialiased, model_folder_of, read_cfg_args

from .cameras import ViewCamera, read_cameras_json


@dataclass
class LoadedModel:
    folder: Path  # the model folder (or the .ply's folder): screenshots are saved here
    ply_path: Path
    step: Optional[int]  # the training iteration of the .ply, when known
    params: Dict[str, np.ndarray]  # pre-activation, as read_ply returns them
    sh_degree: int
    cameras: List[ViewCamera] = field(default_factory=list)
    antialiased: bool = False  # trained with --antialiased (cfg_args): the server render uses it

    @property
    def num_gaussians(self) -> int:
        return int(self.params["means"].shape[0])


def _image_dirs(folder: Path) -> List[Path]:
    """Where the training images may be: cfg_args' source_path/images, then the usual names."""
    dirs: List[Path] = []
    cfg_path = folder / "cfg_args"
    if cfg_path.is_file():
        try:
            cfg = read_cfg_args(cfg_path)
        except TurboGSError:
            cfg = {}  # an unreadable cfg_args only costs the thumbnails
        source = cfg.get("source_path")
        if isinstance(source, str) and source:
            images = cfg.get("images") if isinstance(cfg.get("images"), str) and cfg.get("images") else "images"
            dirs += [Path(source) / images, Path(source) / "images", Path(source)]
    dirs.append(folder / "images")
    return [d for d in dirs if d.is_dir()]


def load_model(model) -> LoadedModel:
    """Read the Gaussians and, when present, the training cameras (with thumbnails)."""
    model = Path(model)
    if model.is_file() and model.suffix.lower() not in READABLE_SUFFIXES:
        raise InputError(f"{model}: expected a model folder or a .ply, .spz or .sog file")
    ply_path, step = find_model_ply(model)
    folder = model.resolve() if model.is_dir() else model_folder_of(ply_path)
    params, sh_degree = read_gaussians(ply_path)
    cameras_json = folder / "cameras.json"
    cameras = read_cameras_json(cameras_json, _image_dirs(folder)) if cameras_json.is_file() else []
    return LoadedModel(folder=folder, ply_path=ply_path, step=step, params=params, sh_degree=sh_degree, cameras=cameras,
                       antialiased=model_antialiased(folder))
