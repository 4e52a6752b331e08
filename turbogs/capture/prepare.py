"""What `turbogs sfm` and `turbogs train` were given, made into a capture folder with a COLMAP model.

- A video: its frames go to a folder named after it, beside it (`clip.mp4` -> `clip/images/`), or
  under `out`; then SfM runs with sequential matching. A later run reuses the frames and the model.
- A folder of photos without a model: SfM writes `sparse/0`; a later run reuses it (`force` reruns).
- Anything else (a COLMAP capture, transforms.json) is left as it is.

`sfm_here=False` is for the ranks of a torchrun run other than rank 0: rank 0 runs the SfM once and
they read its model; a model they do not find (a machine without the capture folder rank 0 wrote
to) is one line, never a second SfM whose model would differ from rank 0's.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from turbogs.capture import frames as video_frames
from turbogs.capture.photos import VIDEO_SUFFIXES, find_photos, has_photos, is_video
from turbogs.capture.sfm import SfmOptions, run_sfm
from turbogs.capture.summary import SfmSummary
from turbogs.data.colmap import find_model_folder
from turbogs.errors import InputError
from turbogs.fileio import atomic_write_text


@dataclass
class Prepared:
    scene: Path  # the capture folder to load
    images: Optional[str]  # load_scene's images option when the photos are not in images/, else None
    summary: Optional[SfmSummary] = None  # None when an earlier model was reused


def needs_capture(path: Path) -> bool:
    """For `turbogs train`: a video; a folder of photos with neither a COLMAP model nor a transforms
    file; or one whose model SfM wrote beside photos that are not in images/ (`images` must say so)."""
    path = Path(path)
    if path.is_file():
        return is_video(path)
    if not path.is_dir() or any((path / f).is_file() for f in ("transforms.json", "transforms_train.json")):
        return False
    if find_model_folder(path) is None:
        return has_photos(path)
    return not (path / "images").is_dir() and has_photos(path)


def prepare(path: Path, *, force: bool = False, frames: Optional[int] = None, out: Optional[Path] = None,
            options: SfmOptions = SfmOptions(), log: Callable[[str], None] = print,
            sfm_here: bool = True) -> Prepared:
    path = Path(path)
    sequential = False

    def missing(what: str) -> InputError:
        return InputError(f"{path}: no {what}, which rank 0's SfM wrote: every machine of a torchrun run needs the "
                          "capture folder on a shared file system (or run turbogs sfm first and copy the folder)")

    if path.is_file():
        if not is_video(path):
            raise InputError(f"{path} is a file, not a folder of photos or a video ({', '.join(VIDEO_SUFFIXES)})")
        scene = Path(out) if out is not None else path.with_suffix("")
        images_dir = scene / "images"
        if not sfm_here and not any(images_dir.glob("frame_*.jpg")):
            raise missing(f"frames in {images_dir}")
        if force or not any(images_dir.glob("frame_*.jpg")):
            if force and images_dir.exists():
                shutil.rmtree(images_dir)
            video_frames.extract_frames(path, images_dir, frames or video_frames.DEFAULT_FRAMES,
                                        progress=options.progress, log=log)
        else:
            log(f"using the frames already in {images_dir} (turbogs sfm --force extracts them again)")
        path, sequential = scene, True
    elif out is not None or frames is not None:
        flag = "--out" if out is not None else "--frames"
        raise InputError(f"{flag} is for a video (its frames); {path} is a folder, whose model goes to sparse/0")
    photos = find_photos(path)
    images = photos.images_option if photos.images_option != "images" else None
    model = find_model_folder(path)
    if model is not None and not force:
        log(f"using the COLMAP model in {model} from an earlier run (turbogs sfm --force runs SfM again)")
        return Prepared(path, images)
    if not sfm_here:
        raise missing(f"COLMAP model in {path / 'sparse' / '0'}")
    if sequential and options.matching == "auto":
        options = dataclasses.replace(options, matching="sequential")
    log(f"structure from motion on {len(photos.names)} photos in {photos.images_dir}")
    summary = run_sfm(photos, options, log)
    for line in summary.lines():
        log(line)
    atomic_write_text(path / "sparse" / "0" / "turbogs_sfm.json", json.dumps(summary.to_dict(), indent=1))
    log(f"COLMAP model written to {path / 'sparse' / '0'}")
    return Prepared(path, images, summary)

