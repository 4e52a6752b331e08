"""`turbogs sfm PHOTOS/|clip.mp4`: structure from motion alone, in our process (pycolmap), writing the
COLMAP model that `turbogs train` then reads."""

from __future__ import annotations

import argparse
from pathlib import Path

from turbogs.capture.sfm import CAMERA_MODELS
from turbogs.cli.args import positive_int


def add_parser(subcommands) -> None:
    p = subcommands.add_parser(
        "sfm", help="structure from motion on a folder of photos or a video: writes the COLMAP model to sparse/0",
        description="Find the cameras of a folder of photos (or of a video's frames) with COLMAP's SfM through "
                    "pycolmap, and write the model to FOLDER/sparse/0 (binary). `turbogs train FOLDER` does this "
                    "itself when the folder has no model.")
    p.add_argument("photos", help="folder of photos (or with an images/ subfolder), or a video file (.mp4, .mov, ...)")
    p.add_argument("--force", action="store_true", help="run SfM (and for a video, frame extraction) again over an "
                                                        "existing model")
    p.add_argument("--out", "-o", metavar="DIR",
                   help="for a video: the capture folder for its frames and model (default: beside the video, "
                        "named after it)")
    add_sfm_flags(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from turbogs.capture.prepare import prepare

    done = prepare(Path(args.photos), force=args.force, frames=args.frames, out=Path(args.out) if args.out else None,
                   options=sfm_options(args))
    print(f"train it: turbogs train {done.scene}")
    return 0


def add_sfm_flags(p: argparse.ArgumentParser) -> None:
    """How SfM finds the cameras of photos or a video: `turbogs sfm`'s flags, which `turbogs train`
    passes on when it is given photos or a video."""
    p.add_argument("--frames", type=positive_int, metavar="N",
                   help="for a video: keep the sharpest frame of each of N equal windows (default 100)")
    p.add_argument("--matching", choices=["auto", "exhaustive", "sequential"], default="auto",
                   help="image pairs to match: every pair, or each image with its next 10 (default: exhaustive up to "
                        "300 photos, sequential beyond and for video frames)")
    p.add_argument("--max-image-size", type=positive_int, default=1600, metavar="PX",
                   help="SIFT runs on images at most this many px wide and high (default 1600)")
    p.add_argument("--camera-model", choices=CAMERA_MODELS, default="SIMPLE_RADIAL",
                   help="the COLMAP camera model SfM fits (default SIMPLE_RADIAL, for phone photos; OPENCV_FISHEYE "
                        "and the other fisheye models for action cameras); training undistorts it on load")
    p.add_argument("--thorough", action="store_true",
                   help="guided matching and twice the SIFT features (16384): registers more of sparse or unordered "
                        "photos, at several times the matching time")


def sfm_options(args: argparse.Namespace):
    """The SfmOptions that add_sfm_flags' flags ask for."""
    from turbogs.capture.sfm import SfmOptions

    return SfmOptions.make(args.thorough, matching=args.matching, max_image_size=args.max_image_size,
                           progress=not args.quiet, camera_model=args.camera_model)
