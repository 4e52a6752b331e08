"""`turbogs render MODEL`: a model's views as PNGs, or a fly-through video along a camera path."""

from __future__ import annotations

import argparse
from pathlib import Path

from turbogs.cli.args import add_device, positive_float, positive_int
from turbogs.device import pick_device
from turbogs.errors import TurboGSError
from turbogs.render.camera_paths import PATHS


def add_parser(subcommands) -> None:
    p = subcommands.add_parser("render", help="render a model's views to PNG files, or a fly-through video (--path)")
    p.add_argument("model", help="model folder written by `turbogs train`")
    p.add_argument("--split", choices=["test", "train", "all"], default="test", help="which views (default: test)")
    p.add_argument("--source", help="capture folder (default: the one named in the model's cfg_args)")
    p.add_argument("--out", "-o", help="folder for the PNGs (default: MODEL/<split>/ours_N/renders)")
    p.add_argument("--path", choices=PATHS,
                   help="render a fly-through instead of the views: orbit the cameras' focus, LLFF's spiral, "
                        "or interpolate through the training cameras")
    p.add_argument("--video", metavar="FILE.mp4",
                   help="with --path: the MP4 to write, H.264 (yuv420p, plays in browsers) through imageio-ffmpeg; "
                        "without it installed, MPEG-4 Part 2 (mp4v), and a line says so")
    p.add_argument("--frames", type=positive_int, default=120, help="with --path: number of frames (default 120)")
    p.add_argument("--fps", type=positive_float, default=30.0, help="with --path: frames per second (default 30)")
    p.add_argument("--width", type=positive_int, help="with --path: frame width in px, rounded to even (default: the training views')")
    p.add_argument("--frames-dir", metavar="DIR", help="with --path: also write the frames as PNGs here")
    add_device(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from turbogs.formats import model_folder as model
    from turbogs.render import render
    from turbogs.render.png import write_png

    device = pick_device(args.device, args.threads)
    model_dir = Path(args.model)
    if args.path:
        return render_camera_path(args, model_dir, device)
    if args.video or args.frames_dir:
        raise TurboGSError("--video and --frames-dir render a camera path: add --path orbit|spiral|interpolate")
    gaussians, step = model.load_gaussians(model_dir, device)
    scene = model.scene_for_model(model_dir, args.source, eval_split=args.split != "all")
    cameras = {"train": scene.train, "test": scene.test, "all": scene.train}[args.split]
    out_dir = Path(args.out) if args.out else model_dir / args.split / f"ours_{step or 0}" / "renders"
    background = scene.background(device)
    with torch.no_grad():
        for camera in cameras:
            write_png(out_dir / f"{Path(camera.name).stem}.png", render(gaussians, camera, background=background).image)
    print(f"rendered {len(cameras)} {args.split} views to {out_dir}")
    return 0


def render_camera_path(args: argparse.Namespace, model_dir: Path, device) -> int:
    """`render --path`: a fly-through video (and/or PNG frames) along a camera path."""
    import torch

    from turbogs.formats import model_folder as model
    from turbogs.render.video import path_cameras, render_path

    if not args.video and not args.frames_dir:
        raise TurboGSError("--path needs --video FILE.mp4 and/or --frames-dir DIR")
    if args.video and Path(args.video).suffix.lower() != ".mp4":
        raise TurboGSError(f"--video {args.video}: the video is written as MP4; name it .mp4")
    gaussians, _ = model.load_gaussians(model_dir, device)
    scene = model.scene_for_model(model_dir, args.source, eval_split=False) if args.source else None
    cameras = path_cameras(model_dir, args.path, args.frames, args.width, scene)
    background = scene.background(device) if scene is not None else torch.zeros(3, device=device)  # black, as training's default
    codec = render_path(gaussians, cameras, background, Path(args.video) if args.video else None, args.fps,
                        Path(args.frames_dir) if args.frames_dir else None)
    outputs = [f"{args.video} ({'H.264' if codec == 'h264' else codec})"] if args.video else []
    outputs += [args.frames_dir] if args.frames_dir else []
    print(f"rendered {len(cameras)} frames ({cameras[0].width}x{cameras[0].height}, {args.path} path) to "
          + " and ".join(outputs))
    return 0
