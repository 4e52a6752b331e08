"""A folder of photos: where they are, which files count, and how many cameras took them.

The photos are either the folder's own files or those of its `images/` subfolder (COLMAP's layout);
subfolders count too (one camera per folder), except the ones TurboGS and COLMAP write beside the
photos (sparse/, masks/, images_N/, hidden folders such as .turbogs_cache/).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from turbogs.errors import InputError

PHOTO_SUFFIXES = (".jpg", ".jpeg", ".png", ".tif", ".tiff", ".bmp", ".webp")
VIDEO_SUFFIXES = (".mp4", ".mov", ".m4v", ".avi", ".mkv", ".webm")
MIN_PHOTOS = 3  # two views give one relative pose and no check of it; SfM needs a third
_SKIPPED_FOLDERS = re.compile(r"^(sparse|masks|distorted|stereo|images_\d+|\..*)$")


@dataclass
class PhotoFolder:
    scene: Path  # the capture folder: the model goes to scene/sparse/0
    images_dir: Path  # where the photos are: scene/images, or scene itself
    names: List[str]  # photo paths relative to images_dir, '/'-separated, sorted

    @property
    def images_option(self) -> str:
        """What `load_scene(images=...)` needs to find these photos from `scene`."""
        return "images" if self.images_dir != self.scene else "."


def is_video(path: Path) -> bool:
    return Path(path).suffix.lower() in VIDEO_SUFFIXES


def _photos_under(folder: Path) -> List[str]:
    found = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(_SKIPPED_FOLDERS.match(part) for part in rel.parts[:-1]):
            continue
        if path.suffix.lower() in PHOTO_SUFFIXES and path.is_file() and not path.name.startswith("."):
            found.append(rel.as_posix())
    return found


def find_photos(scene: Path) -> PhotoFolder:
    """The photos of a capture folder; fewer than MIN_PHOTOS is an InputError saying so."""
    scene = Path(scene)
    if not scene.is_dir():
        raise InputError(f"{scene} is not a folder of photos" if scene.exists() else f"{scene} does not exist")
    images_dir = scene / "images" if (scene / "images").is_dir() else scene
    names = _photos_under(images_dir)
    if not names:
        raise InputError(f"{images_dir}: no photos found (looked for {', '.join(PHOTO_SUFFIXES)}); "
                         "put the photos of one scene in the folder, or give a video")
    if len(names) < MIN_PHOTOS:
        raise InputError(f"{images_dir}: {len(names)} photo{'s' if len(names) > 1 else ''} found; structure from "
                         f"motion needs at least {MIN_PHOTOS} overlapping photos of the scene (20 or more work best)")
    return PhotoFolder(scene, images_dir, names)


def has_photos(scene: Path) -> bool:
    """True for a folder that holds photos (directly or in images/), whatever else it holds."""
    scene = Path(scene)
    if not scene.is_dir():
        return False
    images_dir = scene / "images" if (scene / "images").is_dir() else scene
    return bool(_photos_under(images_dir))


def camera_mode(folder: PhotoFolder, describe) -> str:
    """'PER_FOLDER' when, in every folder, all photos share one size and EXIF camera (their
    make, model and focal length, as `describe(path)` gives them), else 'PER_IMAGE': one camera
    with shared intrinsics is a much better-posed SfM problem, but only when it is true."""
    seen: Dict[str, Tuple] = {}
    for name in folder.names:
        key = describe(folder.images_dir / name)
        parent = str(Path(name).parent)
        if seen.setdefault(parent, key) != key:
            return "PER_IMAGE"
    return "PER_FOLDER"
