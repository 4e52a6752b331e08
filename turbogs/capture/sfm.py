"""Structure from motion in our process, through pycolmap (COLMAP's own Python binding).

Three phases, each with a progress bar that counts what COLMAP has finished: SIFT features (the
images with keypoints in COLMAP's database), matching (the image pairs verified), and incremental
mapping (the images registered, from its next-image callback). pycolmap releases the GIL in each
phase, so a thread of ours reads the counts from the SQLite database while COLMAP works.

Choices, and why:
- Exhaustive matching up to EXHAUSTIVE_MAX images (every pair: unordered photos need it), then
  sequential (each image with its next SEQUENTIAL_OVERLAP), which is also the choice for video
  frames, whose order is their overlap.
- One camera per folder when the photos there share size and EXIF camera (photos.camera_mode).
- The largest model is kept when the mapping splits, and the summary says how many images were
  left out. Fewer than MIN_REGISTERED registered images, or under half of them, is an InputError
  naming what to try.
- A fisheye model (OPENCV_FISHEYE, ...) starts from a focal length that spans FISHEYE_DIAGONAL_FOV
  over the image diagonal, marked as known (fisheye_focal_prior). COLMAP's own start is a pinhole's
  (1.2 x the larger side, unknown), and with it a fisheye capture fails twice: geometric
  verification without a known focal found every pair degenerate (0 of 120 pairs on a 137-degree
  capture of scenes/), and with the pinhole focal marked known, mapping registered 2 of 16 photos.
  The fisheye start registered all 16, and SfM still refines the focal length.
- The model is written to SCENE/sparse/0 (binary) through a temporary folder and a rename, so an
  interrupted run leaves no half model that a later run would take for a finished one.
"""

from __future__ import annotations

import math
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from turbogs.capture.photos import PhotoFolder, camera_mode
from turbogs.capture.summary import SfmSummary
from turbogs.errors import InputError, TurboGSError

INSTALL = 'pip install -e ".[capture]" (or pip install pycolmap)'
EXHAUSTIVE_MAX = 300
SEQUENTIAL_OVERLAP = 10
MIN_REGISTERED = 3
MAX_IMAGE_SIZE = 1600  # SIFT runs on images at most this wide (COLMAP's own default is 3200)
FISHEYE_DIAGONAL_FOV = 150.0  # degrees: the start of a fisheye camera without EXIF focal (action cameras: 120-180)


# The camera models SfM may fit, all of which data/colmap.py reads and undistorts: COLMAP's default
# (SIMPLE_RADIAL, one radial term) suits phone photos; the fisheye ones suit action cameras.
CAMERA_MODELS = ("SIMPLE_RADIAL", "SIMPLE_PINHOLE", "PINHOLE", "RADIAL", "OPENCV", "OPENCV_FISHEYE",
                 "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")
FISHEYE_MODELS = ("OPENCV_FISHEYE", "SIMPLE_RADIAL_FISHEYE", "RADIAL_FISHEYE")  # equidistant: radius = f theta


@dataclass
class SfmOptions:
    matching: str = "auto"  # auto | exhaustive | sequential
    max_image_size: int = MAX_IMAGE_SIZE
    progress: bool = True
    camera_model: str = "SIMPLE_RADIAL"
    retry: bool = True  # a second mapping pass over the photos the first left out (see RETRY_MAPPER)
    guided_matching: bool = False
    max_num_features: int = 8192  # COLMAP's default
    num_threads: int = -1  # COLMAP's: every core

    @property
    def thorough(self) -> bool:
        return self.guided_matching and self.max_num_features >= THOROUGH_FEATURES

    @classmethod
    def make(cls, thorough: bool = False, **fields) -> "SfmOptions":
        """`turbogs sfm --thorough`: guided matching and THOROUGH_FEATURES SIFT features."""
        if thorough:
            fields.update(guided_matching=True, max_num_features=THOROUGH_FEATURES)
        return cls(**fields)


# The second mapping pass over the photos the first left out: it continues the largest model and
# registers a photo on fewer 2D-3D inliers than COLMAP's first pass asks (30, ratio 0.25), trying each
# photo more often. It runs only when photos were left out, and costs a mapping pass.
RETRY_MAPPER = {"abs_pose_min_num_inliers": 15, "abs_pose_min_inlier_ratio": 0.15, "max_reg_trials": 6}
THOROUGH_FEATURES = 16384  # twice COLMAP's default, with guided matching: turbogs sfm --thorough
RETRY_MIN_NUM_MATCHES = 10  # COLMAP's 15: pairs with fewer verified matches are not used


def import_pycolmap():
    """pycolmap, quiet (its C++ log would drown the bars), or an InputError naming the install."""
    try:
        import pycolmap
    except ImportError:
        raise InputError(f"structure from motion needs pycolmap, which is not installed: {INSTALL}") from None
    pycolmap.logging.minloglevel = 3  # fatal only: what goes wrong reaches the user as our one line
    pycolmap.logging.stderrthreshold = 3
    return pycolmap


def matching_kind(options: SfmOptions, num_images: int) -> str:
    if options.matching != "auto":
        return options.matching
    return "exhaustive" if num_images <= EXHAUSTIVE_MAX else "sequential"


def pair_count(kind: str, n: int) -> int:
    """The image pairs a matcher will verify: every pair, or each image with its next few."""
    if kind == "exhaustive":
        return n * (n - 1) // 2
    return sum(min(SEQUENTIAL_OVERLAP, n - 1 - i) for i in range(n))


# How often a bar reads COLMAP's database (once a second is enough for a bar). The read takes no lock
# (_count_rows): COLMAP sets no busy timeout and aborted the process on "database is locked" when a
# locking read met its commit (a third to a half of the extractions with fast polling, once in about
# 15 at 0.25 s; tests/test_capture.py hammers the read to keep it that way).
POLL_SECONDS = 1.0


def _count_rows(database: Path, table: str) -> Optional[int]:
    try:
        # immutable=1: no file locks at all. A reader's shared lock, held at the instant COLMAP
        # commits, made COLMAP (which sets no busy timeout) abort on "database is locked"; a
        # lock-free read can at worst see a half-written page, an error here, a skipped tick.
        with closing(sqlite3.connect(f"file:{database}?mode=ro&immutable=1", uri=True)) as db:
            return db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    except sqlite3.Error:  # not created yet, or caught mid-write
        return None


def _phase(name: str, total: int, unit: str, work: Callable[[], None], database: Path, table: str,
           progress: bool) -> float:
    """Run one COLMAP call in a thread, showing the rows it has written to `table`; its seconds."""
    from tqdm import tqdm

    errors = []

    def target():
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors.append(exc)

    start = time.perf_counter()
    thread = threading.Thread(target=target, name=f"sfm-{name}", daemon=True)
    with tqdm(total=total, desc=name, unit=unit, disable=not progress, leave=True) as bar:
        thread.start()
        while thread.is_alive():
            thread.join(POLL_SECONDS)
            if not progress:
                continue
            done = _count_rows(database, table)
            if done is not None and done > bar.n:
                bar.update(min(done, total) - bar.n)
        if not errors:
            bar.update(total - bar.n)
    if errors:
        exc = errors[0]
        raise TurboGSError(f"SfM failed while {name}: {exc}") from exc
    return time.perf_counter() - start


def run_sfm(folder: PhotoFolder, options: SfmOptions = SfmOptions(), log: Callable[[str], None] = print) -> SfmSummary:
    """Features, matching and mapping over the folder's photos; the largest model goes to
    folder.scene/sparse/0. Returns what happened; raises InputError when too little registered."""
    pycolmap = import_pycolmap()
    device = pycolmap.Device.auto
    n = len(folder.names)
    mode = camera_mode(folder, lambda path: _describe(pycolmap, path))
    kind = matching_kind(options, n)
    summary = SfmSummary(total_images=n, matching=kind, camera_mode=mode, thorough=options.thorough)
    with tempfile.TemporaryDirectory(prefix="turbogs-sfm-") as work:
        database = Path(work) / "database.db"
        extraction = pycolmap.FeatureExtractionOptions()
        extraction.max_image_size = options.max_image_size
        extraction.num_threads = options.num_threads
        extraction.sift.max_num_features = options.max_num_features
        matching = pycolmap.FeatureMatchingOptions()
        matching.num_threads = options.num_threads
        matching.guided_matching = options.guided_matching
        reader = pycolmap.ImageReaderOptions()
        reader.camera_model = options.camera_model
        summary.seconds["features"] = _phase(
            "features", n, "img",
            lambda: pycolmap.extract_features(database, folder.images_dir, image_names=folder.names,
                                              camera_mode=getattr(pycolmap.CameraMode, mode), reader_options=reader,
                                              extraction_options=extraction, device=device),
            database, "keypoints", options.progress)
        if options.camera_model in FISHEYE_MODELS:
            fisheye_focal_prior(pycolmap, database)
        if kind == "exhaustive":
            match = lambda: pycolmap.match_exhaustive(database, matching_options=matching, device=device)  # noqa: E731
        else:
            pairing = pycolmap.SequentialPairingOptions()
            pairing.overlap = SEQUENTIAL_OVERLAP
            pairing.quadratic_overlap = False
            match = lambda: pycolmap.match_sequential(  # noqa: E731
                database, matching_options=matching, pairing_options=pairing, device=device)
        summary.seconds["matching"] = _phase("matching", pair_count(kind, n), "pair", match, database,
                                             "two_view_geometries", options.progress)
        models, summary.seconds["mapping"] = _map(pycolmap, database, folder, Path(work) / "models", options)
        first = max((r.num_reg_images() for r in models.values()), default=0)
        if options.retry and 0 < first < n:
            models, summary.seconds["retry"] = _retry(pycolmap, database, folder, Path(work), models, options)
            summary.retried = max(r.num_reg_images() for r in models.values()) - first
    if not models:
        more = "" if options.thorough else "; turbogs sfm --thorough may still find them"
        raise InputError(f"{folder.images_dir}: SfM registered none of the {n} photos: they do not overlap enough "
                         f"(take photos a few steps apart, each sharing most of the view with the next){more}")
    best = max(models.values(), key=lambda r: r.num_reg_images())
    summary.models = sorted((r.num_reg_images() for r in models.values()), reverse=True)
    summary.registered = best.num_reg_images()
    summary.points = best.num_points3D()
    summary.reprojection_error = float(best.compute_mean_reprojection_error())
    summary.check(folder.images_dir, MIN_REGISTERED)
    write_model(best, folder.scene)
    return summary


def fisheye_focal(width: int, height: int) -> float:
    """The equidistant focal length (radius = f theta) whose image diagonal spans FISHEYE_DIAGONAL_FOV."""
    return math.hypot(width, height) / 2 / math.radians(FISHEYE_DIAGONAL_FOV / 2)


def fisheye_focal_prior(pycolmap, database: Path) -> None:
    """Give every fisheye camera without an EXIF focal length fisheye_focal, marked as known: the
    start that lets COLMAP verify and map a fisheye capture (see the module's docstring)."""
    db = pycolmap.Database.open(str(database))
    try:
        for camera in db.read_all_cameras():
            if camera.has_prior_focal_length:
                continue
            params = camera.params.copy()
            params[list(camera.focal_length_idxs())] = fisheye_focal(camera.width, camera.height)
            camera.params = params
            camera.has_prior_focal_length = True
            db.update_camera(camera)
    finally:
        db.close()


def _describe(pycolmap, path: Path):
    """What makes two photos' cameras the same: size, and the focal length COLMAP reads from EXIF."""
    try:
        camera = pycolmap.infer_camera_from_image(path)
    except Exception as exc:  # noqa: BLE001 - pycolmap raises its own types for unreadable files
        raise InputError(f"cannot read photo {path}: {exc}") from None
    return camera.width, camera.height, camera.has_prior_focal_length, tuple(round(p, 3) for p in camera.params)


def _mapping_options(pycolmap, options: SfmOptions):
    mapping = pycolmap.IncrementalPipelineOptions()
    mapping.min_model_size = MIN_REGISTERED  # COLMAP's default (10) would drop a small capture whole
    mapping.num_threads = options.num_threads
    return mapping


def _map(pycolmap, database: Path, folder: PhotoFolder, out: Path, options: SfmOptions):
    from tqdm import tqdm

    out.mkdir(parents=True, exist_ok=True)
    mapping = _mapping_options(pycolmap, options)
    start = time.perf_counter()
    with tqdm(total=len(folder.names), desc="mapping", unit="img", disable=not options.progress) as bar:
        def next_image():
            bar.update(1)

        models = pycolmap.incremental_mapping(database, folder.images_dir, out, options=mapping,
                                              initial_image_pair_callback=lambda: bar.update(2),
                                              next_image_callback=next_image)
        registered = max((r.num_reg_images() for r in models.values()), default=0)
        bar.n = min(registered, bar.total)
        bar.refresh()
    return models, time.perf_counter() - start


def retry_options(pycolmap, options: SfmOptions):
    """The second pass's mapping options: RETRY_MAPPER and RETRY_MIN_NUM_MATCHES over the first's."""
    mapping = _mapping_options(pycolmap, options)
    mapping.min_num_matches = RETRY_MIN_NUM_MATCHES
    for name, value in RETRY_MAPPER.items():
        setattr(mapping.mapper, name, value)
    return mapping


def _retry(pycolmap, database: Path, folder: PhotoFolder, work: Path, models: dict, options: SfmOptions):
    """Continue the largest model over the photos it left out (retry_options); the models to keep
    (the first pass's when the second registers no more) and the seconds it took."""
    from tqdm import tqdm

    key, best = max(models.items(), key=lambda item: item[1].num_reg_images())
    start_dir, out = work / "retry_in", work / "retry"
    start_dir.mkdir()
    out.mkdir()
    best.write_binary(str(start_dir))
    start = time.perf_counter()
    with tqdm(total=len(folder.names), initial=best.num_reg_images(), desc="second mapping pass", unit="img",
              disable=not options.progress) as bar:
        again = pycolmap.incremental_mapping(database, folder.images_dir, out, options=retry_options(pycolmap, options),
                                             input_path=start_dir, next_image_callback=lambda: bar.update(1))
        bar.n = min(max((r.num_reg_images() for r in again.values()), default=0), bar.total)
        bar.refresh()
    seconds = time.perf_counter() - start
    if max((r.num_reg_images() for r in again.values()), default=0) <= best.num_reg_images():
        return models, seconds
    # The first pass's other models stay only where they hold photos the second did not register (the
    # summary's "split into N models" counts them): otherwise the split is what the second pass mended.
    kept = {-1 - k: r for k, r in again.items()}
    registered = set().union(*(_names(r) for r in kept.values()))
    kept.update({k: r for k, r in models.items() if k != key and not _names(r) <= registered})
    return kept, seconds


def _names(reconstruction) -> set:
    return {reconstruction.images[i].name for i in reconstruction.reg_image_ids()}


def write_model(reconstruction, scene: Path) -> Path:
    """The model as COLMAP binary files in scene/sparse/0, replacing any model there only once the
    new one is complete."""
    target = Path(scene) / "sparse" / "0"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".0.", dir=target.parent))
        reconstruction.write_binary(str(staging))
        old = None
        if target.exists():
            old = target.with_name(f".0.old.{os.getpid()}")
            os.replace(target, old)
        os.replace(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as exc:
        raise TurboGSError(f"cannot write the COLMAP model to {target}: {exc.strerror or exc}") from None
    return target
