"""The model folder, in INRIA's layout so that SIBR, SuperSplat and other viewers open it.

    MODEL/
      cfg_args                                   Namespace(...) line that SIBR reads
      cameras.json                               INRIA camera list (cam-to-world)
      input.ply                                  the initial points
      point_cloud/iteration_N/point_cloud.ply    the trained Gaussians
      results.json, per_view.json, test/...      written by eval
      checkpoints/                               resumable training state
      stopped.json                               only for a run stopped before its end (--resume continues it)

Every file is written atomically. `cfg_args` is written for SIBR's sake and read back
with a literal-only parser: it is never evaluated.
"""

from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from turbogs.data.scene import Camera, Scene
from turbogs.errors import InputError
from turbogs.fileio import atomic_write_json, atomic_write_text, read_json
from turbogs.formats.ply import write_ply, write_points_ply

STOPPED_MARK = "stopped.json"


def write_cfg_args(model_dir: Path, scene: Scene, sh_degree: int, images: str, resolution: int, eval_split: bool,
                   antialiased: bool = False, parts: Optional[Dict[str, object]] = None) -> None:
    """INRIA's fields, which SIBR reads, plus `antialiased` (the model's render mode: eval,
    render and view read it back, so that a model trained with --antialiased is shown as it
    was trained; Mip-Splatting's and gsplat's trainers add fields to this file the same way),
    and the method's `parts` the run used (TrainConfig.parts: sampler, loss, density, optimizer)."""
    fields = {
        "sh_degree": sh_degree,
        "source_path": str(Path(scene.source_path).resolve()) if scene.source_path else "",
        "model_path": str(Path(model_dir).resolve()),
        "images": images,
        "resolution": resolution,
        "white_background": scene.white_background,
        "data_device": "cuda",
        "eval": eval_split,
        "antialiased": bool(antialiased),
        **(parts or {}),
    }
    text = "Namespace(" + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ")"
    atomic_write_text(Path(model_dir) / "cfg_args", text)


def read_cfg_args(path: Path) -> Dict[str, object]:
    """Parse `Namespace(a=1, b='x', ...)` with ast.literal_eval on each value only."""
    text = Path(path).read_text().strip()
    if not (text.startswith("Namespace(") and text.endswith(")")):
        raise InputError(f"{path}: not a cfg_args file (expected 'Namespace(...)')")
    try:
        call = ast.parse(text, mode="eval").body  # parsing runs nothing; literal_eval evaluates literals only
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Namespace"
                and not call.args and all(kw.arg for kw in call.keywords)):
            raise ValueError("expected Namespace(name=value, ...) and nothing else")
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as exc:
        raise InputError(f"{path}: unreadable cfg_args ({exc})") from None


def camera_json_entry(index: int, camera: Camera) -> dict:
    """INRIA's cameras.json entry: position and rotation of the camera-to-world transform."""
    w2c = camera.world_to_cam.double().numpy()
    c2w = np.linalg.inv(w2c)
    return {
        "id": index,
        "img_name": Path(camera.name).stem,
        "width": camera.width,
        "height": camera.height,
        "position": c2w[:3, 3].tolist(),
        "rotation": c2w[:3, :3].tolist(),
        "fy": float(camera.K[1, 1]),
        "fx": float(camera.K[0, 0]),
    }


def write_cameras_json(model_dir: Path, cameras: List[Camera]) -> None:
    atomic_write_json(Path(model_dir) / "cameras.json", [camera_json_entry(i, c) for i, c in enumerate(cameras)])


def write_input_ply(model_dir: Path, points: np.ndarray, colors: np.ndarray) -> None:
    write_points_ply(Path(model_dir) / "input.ply", points.astype(np.float32), (np.clip(colors, 0, 1) * 255).astype(np.uint8))


def point_cloud_path(model_dir: Path, step: int) -> Path:
    return Path(model_dir) / "point_cloud" / f"iteration_{step}" / "point_cloud.ply"


def write_gaussians(model_dir: Path, step: int, params: Dict[str, np.ndarray]) -> Path:
    path = point_cloud_path(model_dir, step)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_ply(path, params)
    return path


def write_model(model_dir: Path, step: int, params: Dict[str, np.ndarray], stopped: Optional[dict] = None,
                appearance: Optional[dict] = None) -> None:
    """The Gaussians at `step`; `stopped` ({"stopped_by", "progress"}) marks a run that ended
    before its end so that `--resume` continues it, and a finished model clears that mark;
    `appearance`: the per-photo colour corrections. Older iterations go only once the new one
    is written, so a failed write leaves the previous model as it was."""
    model_dir = Path(model_dir)
    write_gaussians(model_dir, step, params)
    if stopped is not None:
        atomic_write_json(model_dir / STOPPED_MARK, {"iteration": step, **stopped})
    else:
        (model_dir / STOPPED_MARK).unlink(missing_ok=True)
    remove_other_iterations(model_dir, keep=step)  # a model replaced by --overwrite goes only now
    if appearance is not None:
        atomic_write_json(model_dir / "appearance.json", appearance)


def stopped_mark(model_dir: Path) -> Optional[dict]:
    """The mark of a run stopped before its end ({"iteration", "stopped_by", "progress"}), when it
    describes the model the folder holds; None for a finished model or a mark left stale."""
    path = Path(model_dir) / STOPPED_MARK
    if not path.is_file():
        return None
    try:
        mark = read_json(path)
    except InputError:
        return None
    fields_ok = isinstance(mark.get("stopped_by"), str) and isinstance(mark.get("progress"), (int, float))
    return mark if fields_ok and mark.get("iteration") == latest_iteration(model_dir) else None


def remove_other_iterations(model_dir: Path, keep: int) -> None:
    """Drop point_cloud/iteration_* folders other than `keep` (after it is safely written)."""
    for folder in (Path(model_dir) / "point_cloud").glob("iteration_*"):
        if folder.name != f"iteration_{keep}":
            shutil.rmtree(folder, ignore_errors=True)


def latest_iteration(model_dir: Path) -> Optional[int]:
    root = Path(model_dir) / "point_cloud"
    steps = [int(m.group(1)) for p in root.glob("iteration_*") if (m := re.fullmatch(r"iteration_(\d+)", p.name))
             and (p / "point_cloud.ply").is_file()] if root.is_dir() else []
    return max(steps) if steps else None


def find_model_ply(model: Path) -> Tuple[Path, Optional[int]]:
    """A model folder's latest point_cloud.ply, or the .ply itself."""
    model = Path(model)
    if model.is_file():
        return model, None
    if not model.exists():
        raise InputError(f"{model}: no such model folder or .ply file")
    step = latest_iteration(model)
    if step is None:
        raise InputError(f"{model}: no point_cloud/iteration_*/point_cloud.ply in this model folder")
    return point_cloud_path(model, step), step


def load_model(model: Path):
    """(params, sh_degree, step) of a model folder or a .ply, .spz or .sog file."""
    from turbogs.formats import read_gaussians

    path, step = find_model_ply(model)
    params, sh_degree = read_gaussians(path)
    if len(params["means"]) == 0:
        raise InputError(f"{path}: the model has no Gaussians")
    return params, sh_degree, step


# --- reading a model back for eval / render -------------------------------------------


def scene_for_model(model_dir: Path, source: Optional[str], eval_split: Optional[bool]):
    """Reload the capture a model was trained on, from its cfg_args (or --source)."""
    from turbogs.data.load import load_scene

    cfg_path = model_dir / "cfg_args"
    saved = read_cfg_args(cfg_path) if cfg_path.is_file() else {}
    source = source or saved.get("source_path")
    if not source:
        raise InputError(f"{model_dir}: no cfg_args names the training capture; pass --source SCENE")
    resolution = saved.get("resolution", -1)
    return load_scene(source, resolution=None if resolution in (-1, None) else int(resolution),
                      images=saved.get("images", "images"),
                      eval_split=bool(saved.get("eval", True)) if eval_split is None else eval_split,
                      white_background=bool(saved.get("white_background", False)))


def model_antialiased(model_dir: Path) -> bool:
    """Whether the model in `model_dir` was trained with --antialiased (its cfg_args says so);
    False without a cfg_args, or an older one without the field, or an unreadable one."""
    cfg_path = Path(model_dir) / "cfg_args"
    if not cfg_path.is_file():
        return False
    try:
        return bool(read_cfg_args(cfg_path).get("antialiased", False))
    except InputError:
        return False


def load_gaussians(model: Path, device):
    """The latest iteration of a model folder (or a model file) as Gaussians on `device` (all
    SH bands active, the render mode its cfg_args records, the file's own folder's for a
    file), and its iteration number."""
    import torch

    from turbogs.gaussians import Gaussians

    params, sh_degree, step = load_model(model)
    tensors = {k: torch.from_numpy(v) for k, v in params.items()}
    folder = Path(model) if Path(model).is_dir() else model_folder_of(Path(model))
    gaussians = Gaussians(tensors, sh_degree, active_sh_degree=sh_degree, antialiased=model_antialiased(folder)).to(device)
    return gaussians, step


def model_folder_of(path: Path) -> Path:
    """MODEL for MODEL/point_cloud/iteration_N/point_cloud.ply, else the file's folder (an
    export beside the model's cfg_args)."""
    parts = path.resolve().parts
    if len(parts) >= 4 and parts[-3] == "point_cloud" and parts[-2].startswith("iteration_"):
        return Path(*parts[:-3])
    return path.resolve().parent
