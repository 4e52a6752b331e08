"""`turbogs` command line: train | eval | render | export | view | bench.

Every user-facing problem is a TurboGSError: printed as one line on stderr, exit code 2.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import List, Optional

from turbogs.cliargs import (  # noqa: F401 (the argument types are part of this module's interface)
    add_device, add_torch_twins, pick_device, port_arg, positive_float, positive_int, resolution_arg, run_command,
)
from turbogs.errors import TurboGSError

DEFAULT_PORT = 8080


# --- commands -----------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from turbogs import distributed

    out_dir = Path(args.out) if args.out else Path("output") / Path(args.scene).resolve().name
    if args.nproc > 1 and not distributed.launched_by_torchrun():
        from turbogs.checkpoint import checkpoint_dir
        from turbogs.launch import run_ranks, strip_nproc

        return run_ranks(args.nproc, strip_nproc(args.argv), checkpoints=str(checkpoint_dir(out_dir)))
    device = pick_device(args.device, args.threads)
    world = distributed.join(device.type, timeout_minutes=24 * 60 if args.viewer else 30)
    if world.size > 1 and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
    try:
        return train_as_rank(args, world, device, out_dir)
    finally:
        world.close()


def train_as_rank(args: argparse.Namespace, world, device, out_dir: Path) -> int:
    """`turbogs train` on one process, or on one rank of several (rank 0 alone speaks and writes)."""
    import torch

    from turbogs import kernels
    from turbogs.config import get_preset
    from turbogs.data.load import load_scene
    from turbogs.train import RunOptions
    from turbogs.train_run import train

    kernels.use_torch_twins(args.torch_twins)
    cfg = get_preset(args.preset)
    cfg.seed = args.seed
    if args.sh_degree is not None:
        cfg.sh_degree = args.sh_degree
    if args.init_points is not None:
        cfg.init_random_points = args.init_points
    if args.checkpoint_every is not None:
        cfg.checkpoint_every_seconds = args.checkpoint_every
    if args.checkpoint_every_steps is not None:
        cfg.checkpoint_every_steps = args.checkpoint_every_steps
    apply_ablations(cfg, args)
    cfg.appearance.enabled = cfg.appearance.enabled or args.appearance
    cfg.batch_views = args.batch_views
    if args.batch_lr is not None:
        cfg.batch_lr_rule = args.batch_lr
    cfg = cfg.for_run(args.steps, args.budget_seconds, world_size=world.size)

    failure, scene = None, None
    try:
        scene = load_scene(args.scene, resolution=args.resolution, images=args.images, eval_split=args.eval,
                           white_background=args.white_background, test_every=cfg.test_every)
    except TurboGSError as exc:
        failure = exc
    world.agree(failure)  # every rank read the capture, or every rank stops
    if world.is_main:
        ranks = f" x {world.size} ranks ({world.backend})" if world.size > 1 else ""
        print(f"scene {args.scene}: {len(scene.train)} train / {len(scene.test)} test views, "
              f"{scene.train[0].width}x{scene.train[0].height} px, "
              f"{0 if scene.points is None else len(scene.points)} SfM points; preset {cfg.preset}, "
              + (f"{cfg.budget_seconds:g} s budget (at most {cfg.steps} steps)" if cfg.budget_seconds else f"{cfg.steps} steps")
              + f" of {cfg.batch_views} view(s) on {device}{ranks}")

    viewer = None
    if args.viewer and world.is_main:
        from turbogs.viewer import LiveViewer

        viewer = LiveViewer(scene.train, host=args.host, port=args.port, control=args.viewer_control)
    options = RunOptions(out_dir=out_dir, device=device, resume=args.resume, overwrite=args.overwrite,
                         evaluate=True, progress=not args.quiet, images=args.images,
                         resolution=args.resolution or -1, eval_split=args.eval, viewer=viewer,
                         data_device=None if args.data_device == "auto" else torch.device(args.data_device),
                         max_memory_bytes=None if args.max_memory is None else int(args.max_memory * 2**30),
                         world=world, viewer_on_main=args.viewer and not world.is_main)
    try:
        summary = train(scene, cfg, options)
        if not world.is_main:
            return 0
        report(summary, out_dir)
        if viewer is not None:
            from turbogs.model import latest_iteration, point_cloud_path
            from turbogs.ply import read_ply

            params, _ = read_ply(point_cloud_path(out_dir, latest_iteration(out_dir)))
            viewer.finish(params, block=not args.no_block)  # blocking: serves until Ctrl-C
    finally:
        if viewer is not None:
            viewer.close()  # --no-block, or training failed: free the port, end the threads, exit
    return 0


def apply_ablations(cfg, args: argparse.Namespace) -> None:
    """Switch single TurboGS parts off (or swap them) on top of any preset."""
    from turbogs.config import ABLATIONS

    if args.no_sparse:
        ABLATIONS["no-sparse"](cfg)
    if args.no_ncc:
        ABLATIONS["no-ncc"](cfg)
    if args.density is not None:
        ABLATIONS[f"density-{args.density}"](cfg)
    if args.optimizer is not None:
        ABLATIONS[f"optimizer-{args.optimizer}"](cfg)
    if args.max_gaussians is not None:
        cfg.density.max_gaussians = args.max_gaussians


def report(summary: dict, out_dir: Path) -> None:
    line = f"done: {summary['steps']} steps in {summary['train_seconds']:.1f} s, {summary['num_gaussians']} Gaussians"
    if "psnr" in summary:
        line += f"; test PSNR {summary['psnr']:.2f} dB (colour-corrected {summary.get('psnr_cc', math.nan):.2f}), SSIM {summary['ssim']:.4f}"
        if "lpips" in summary:
            line += f", LPIPS {summary['lpips']:.4f}"
    print(line)
    print(f"model: {out_dir}  (INRIA layout: point_cloud/, cameras.json, cfg_args"
          f"{', results.json' if 'psnr' in summary else ''})")
    print(f"view it: turbogs view {out_dir}")


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from turbogs import model
    from turbogs.evaluate import evaluate_views, write_evaluation

    device = pick_device(args.device, args.threads)
    model_dir = Path(args.model)
    gaussians, step = model.load_gaussians(model_dir, device)
    # a model file (an export: x.spz) is judged with the cfg_args beside it; results go to x.spz_eval/
    scene = model.scene_for_model(model_dir if model_dir.is_dir() else model_dir.parent, args.source, eval_split=True)
    if not scene.test:
        raise TurboGSError(f"{model_dir}: the capture has no test views (train with --eval)")
    background = (torch.ones(3) if scene.white_background else torch.zeros(3)).to(device)
    started = time.perf_counter()
    evaluation = evaluate_views(gaussians, scene.test, background)
    if not model_dir.is_dir():
        model_dir = model_dir.parent / f"{model_dir.name}_eval"
        model_dir.mkdir(exist_ok=True)
    results = write_evaluation(model_dir, step or 0, evaluation, {"num_gaussians": len(gaussians)},
                               save_images=not args.no_images)
    print(f"{len(scene.test)} test views in {time.perf_counter() - started:.1f} s: PSNR {results['psnr']:.2f} dB "
          f"(colour-corrected {results['psnr_cc']:.2f}), SSIM {results['ssim']:.4f}" + (f", LPIPS {results['lpips']:.4f}" if "lpips" in results else ""))
    print(f"wrote {model_dir / 'results.json'} and {model_dir / 'per_view.json'}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    import torch

    from turbogs import model
    from turbogs.evaluate import write_png
    from turbogs.render import render

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
    background = (torch.ones(3) if scene.white_background else torch.zeros(3)).to(device)
    with torch.no_grad():
        for camera in cameras:
            write_png(out_dir / f"{Path(camera.name).stem}.png", render(gaussians, camera, background=background).image)
    print(f"rendered {len(cameras)} {args.split} views to {out_dir}")
    return 0


def render_camera_path(args: argparse.Namespace, model_dir: Path, device) -> int:
    """`render --path`: a fly-through video (and/or PNG frames) along a camera path."""
    import torch

    from turbogs import model
    from turbogs.video import path_cameras, render_path

    if not args.video and not args.frames_dir:
        raise TurboGSError("--path needs --video FILE.mp4 and/or --frames-dir DIR")
    if args.video and Path(args.video).suffix.lower() != ".mp4":
        raise TurboGSError(f"--video {args.video}: the video is written as MP4; name it .mp4")
    gaussians, _ = model.load_gaussians(model_dir, device)
    scene = model.scene_for_model(model_dir, args.source, eval_split=False) if args.source else None
    cameras = path_cameras(model_dir, args.path, args.frames, args.width, scene)
    background = torch.ones(3, device=device) if scene is not None and scene.white_background else torch.zeros(3, device=device)
    render_path(gaussians, cameras, background, Path(args.video) if args.video else None, args.fps,
                Path(args.frames_dir) if args.frames_dir else None)
    print(f"rendered {len(cameras)} frames ({cameras[0].width}x{cameras[0].height}, {args.path} path) to "
          + " and ".join(str(p) for p in (args.video, args.frames_dir) if p))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from turbogs.formats import FORMATS, format_of, write_gaussians
    from turbogs.model import load_model

    out = Path(args.output)
    fmt = args.format or format_of(out)
    if fmt not in FORMATS:
        raise TurboGSError(f"unknown format '{fmt or out.suffix}' (choose --format from {', '.join(FORMATS)})")
    if format_of(out) != fmt:
        raise TurboGSError(f"-o {out}: the extension does not match --format {fmt}; name it *.{fmt}")
    if out.is_dir():
        raise TurboGSError(f"{out}: is a folder; -o takes a file name")
    if not out.parent.is_dir():
        raise TurboGSError(f"{out.parent}: no such folder")
    import torch

    params, sh_degree, _ = load_model(Path(args.model))
    write_gaussians(out, fmt, params, device="cuda" if torch.cuda.is_available() else "cpu")  # .sog's k-means
    print(f"wrote {out} ({len(params['means'])} Gaussians, {fmt}, {out.stat().st_size} bytes"
          f"{', SH DC colors only' if fmt == 'splat' else f', SH degree {sh_degree}'})")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from turbogs.viewer import serve_model

    serve_model(args.model, host=args.host, port=args.port, block=True, control=args.viewer_control)
    return 0


# --- parser -------------------------------------------------------------------------


def add_server(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=port_arg, default=DEFAULT_PORT,
                   help=f"port of the web viewer (default {DEFAULT_PORT}; the next free one if taken)")
    p.add_argument("--viewer-control", action="store_true",
                   help="off loopback, let every browser that reaches the viewer use its controls (pause/resume/stop "
                        "training, screenshots); without it such a viewer is read-only. On loopback they always work")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turbogs", description="Train and look at 3D Gaussian Splatting scenes, fast.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("train", help="train a capture (COLMAP or transforms.json) into a model folder",
                       description="Train a capture into an INRIA-layout model folder.")
    p.add_argument("scene", help="capture folder: COLMAP (sparse/ + images/) or transforms.json / NeRF-synthetic")
    p.add_argument("--out", "-o", "-m", help="model folder to write (default: output/<scene name>)")
    p.add_argument("--preset", default="turbo", choices=["turbo", "3dgs"],
                   help="training recipe: turbo (all four TurboGS parts, 100 s budget) or 3dgs (vanilla INRIA "
                        "baseline, 30000 steps) (default: turbo)")
    p.add_argument("--steps", type=positive_int,
                   help="number of optimisation steps (default: the preset's); alone, it replaces the time budget")
    p.add_argument("--budget-seconds", type=positive_float, metavar="S",
                   help="train for S seconds of training time; every schedule follows the elapsed fraction "
                        "(default: 100 for turbo, none for 3dgs)")
    p.add_argument("-r", "--resolution", type=resolution_arg,
                   help="downscale factor 1|2|4|8, or a target width in px (default: full size, capped at 1600 px wide)")
    p.add_argument("--images", default="images", help="image folder inside the capture (default: images)")
    p.add_argument("--eval", action="store_true",
                   help="hold out every 8th image (name order) as a test view and report PSNR/SSIM at the end")
    p.add_argument("--white-background", "-w", action="store_true", help="composite RGBA images on white, render on white")
    add_device(p)
    add_torch_twins(p)
    p.add_argument("--seed", type=int, default=0, help="random seed; a seeded CPU run is reproducible (default 0)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished model in --out (the old one stays until the new one is written)")
    p.add_argument("--sh-degree", type=int, choices=[0, 1, 2, 3], help="maximum spherical-harmonics degree (default 3)")
    p.add_argument("--init-points", type=positive_int,
                   help="initial points along the camera rays when the capture has none (default 100000)")
    p.add_argument("--max-gaussians", type=positive_int, help="never grow beyond this many Gaussians")
    p.add_argument("--appearance", action="store_true",
                   help="learn a colour transform (3x3 + bias) per training photo, for photos that differ in exposure "
                        "and white balance; test views, viewer and exports show the uncorrected model")
    p.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                   help="write a resumable checkpoint this often, in seconds of wall time (default 60)")
    p.add_argument("--checkpoint-every-steps", type=positive_int, metavar="N",
                   help="also write a checkpoint every N steps (default: by wall time only)")
    p.add_argument("--data-device", choices=["auto", "cpu"], default="auto",
                   help="where the training images live: auto = with the model, cpu = in CPU memory, moved to the "
                        "GPU one view per step (saves GPU memory on large captures)")
    p.add_argument("--max-memory", type=positive_float, metavar="GB",
                   help="refuse to start when the memory estimate exceeds GB gibibytes per device "
                        "(rehearse a smaller machine; default: what the device has free)")
    p.add_argument("--no-sparse", action="store_true", help="ablation: render every tile of every step")
    p.add_argument("--no-ncc", action="store_true", help="ablation: drop the NCC structure term from the tile loss")
    p.add_argument("--density", choices=["3dgs", "error"], help="density control: INRIA's gradient rule or error-driven")
    p.add_argument("--optimizer", choices=["adam", "hybrid"], help="Adam, or the hybrid Hessian-informed/Adam optimizer")
    p.add_argument("--nproc", type=positive_int, default=1, metavar="N",
                   help="data-parallel: N ranks on this machine, one view each per step (one GPU each on CUDA; "
                        "gloo on CPU). Across machines: torchrun --nnodes M --nproc_per_node N -m turbogs train ...")
    p.add_argument("--batch-views", type=positive_int, default=1, metavar="B",
                   help="views per optimizer step on each rank (their mean loss; the optimizer set by --batch-lr, "
                        "schedules counted in views). --steps counts optimizer steps")
    p.add_argument("--batch-lr", choices=["grendel", "sqrt", "none"], default=None,  # config.BATCH_LR_RULES
                   help="the optimizer for V views per step: grendel = Grendel-GS's rule (learning rates x "
                        "sqrt(V), Adam's moments and the curvature average counted in views; turbo's default), "
                        "sqrt = learning rates x sqrt(V) only (3dgs's default), none = unchanged")
    p.add_argument("--viewer", action="store_true", help="watch training live in the browser")
    add_server(p)
    p.add_argument("--no-block", action="store_true", help="with --viewer: exit when training ends instead of serving on")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("eval", help="evaluate a model on its capture's test views",
                       description="Render the test views and write results.json, per_view.json and PNGs.")
    p.add_argument("model", help="model folder written by `turbogs train`")
    p.add_argument("--source", help="capture folder (default: the one named in the model's cfg_args)")
    p.add_argument("--no-images", action="store_true", help="do not save the renders and ground truth as PNG")
    add_device(p)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("render", help="render a model's views to PNG files, or a fly-through video (--path)")
    p.add_argument("model", help="model folder written by `turbogs train`")
    p.add_argument("--split", choices=["test", "train", "all"], default="test", help="which views (default: test)")
    p.add_argument("--source", help="capture folder (default: the one named in the model's cfg_args)")
    p.add_argument("--out", "-o", help="folder for the PNGs (default: MODEL/<split>/ours_N/renders)")
    p.add_argument("--path", choices=["orbit", "spiral", "interpolate"],
                   help="render a fly-through instead of the views: orbit the cameras' focus, LLFF's spiral, "
                        "or interpolate through the training cameras")
    p.add_argument("--video", metavar="FILE.mp4", help="with --path: the MP4 to write")
    p.add_argument("--frames", type=positive_int, default=120, help="with --path: number of frames (default 120)")
    p.add_argument("--fps", type=positive_float, default=30.0, help="with --path: frames per second (default 30)")
    p.add_argument("--width", type=positive_int, help="with --path: frame width in px, rounded to even (default: the training views')")
    p.add_argument("--frames-dir", metavar="DIR", help="with --path: also write the frames as PNGs here")
    add_device(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("export", help="export a model as .ply (INRIA), .splat, .spz (Niantic) or .sog (PlayCanvas)")
    p.add_argument("model", help="model folder, or a .ply, .spz or .sog file")
    p.add_argument("--format", help="ply, splat, spz or sog (default: the -o file's extension)")
    p.add_argument("--output", "-o", required=True, help="file to write")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("view", help="look at a model in the browser")
    p.add_argument("model", help="model folder, or a .ply file")
    add_server(p)
    p.set_defaults(func=cmd_view)

    from turbogs.bench.command import add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    return run_command(build_parser(), list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
