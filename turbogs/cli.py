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

from turbogs.errors import TurboGSError

DEFAULT_PORT = 8080


# --- argument types -----------------------------------------------------------------


def resolution_arg(text: str) -> int:
    """1, 2, 4 or 8 (a downscale factor, as INRIA's -r), or a target width of 16 px or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if value in (1, 2, 4, 8) or value >= 16:
        return value
    raise argparse.ArgumentTypeError(f"{value} is neither a downscale factor (1, 2, 4, 8) nor a width (16 px or more)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{value} must be a positive number")
    return value


def port_arg(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (1-65535)")
    return value


def pick_device(name: str, threads: int = 1):
    """The torch device for --device, and the CPU thread count: on CPU this workload is many
    small ops, which run several times faster on one thread than fighting over two."""
    import torch

    torch.set_num_threads(threads)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TurboGSError("--device cuda: no CUDA GPU is visible to torch (is this a CPU build of torch?)")
    return torch.device(name)


# --- commands -----------------------------------------------------------------------


def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from turbogs.config import get_preset
    from turbogs.data.load import load_scene
    from turbogs.train import RunOptions, train

    device = pick_device(args.device, args.threads)
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
    cfg = cfg.for_run(args.steps, args.budget_seconds)
    out_dir = Path(args.out) if args.out else Path("output") / Path(args.scene).resolve().name

    scene = load_scene(args.scene, resolution=args.resolution, images=args.images, eval_split=args.eval,
                       white_background=args.white_background, test_every=cfg.test_every)
    print(f"scene {args.scene}: {len(scene.train)} train / {len(scene.test)} test views, "
          f"{scene.train[0].width}x{scene.train[0].height} px, "
          f"{0 if scene.points is None else len(scene.points)} SfM points; preset {cfg.preset}, "
          + (f"{cfg.budget_seconds:g} s budget (at most {cfg.steps} steps)" if cfg.budget_seconds else f"{cfg.steps} steps")
          + f" on {device}")

    viewer = None
    if args.viewer:
        from turbogs.viewer import LiveViewer

        viewer = LiveViewer(scene.train, host=args.host, port=args.port)
    options = RunOptions(out_dir=out_dir, device=device, resume=args.resume, overwrite=args.overwrite,
                         evaluate=True, progress=not args.quiet, images=args.images,
                         resolution=args.resolution or -1, eval_split=args.eval, viewer=viewer,
                         data_device=None if args.data_device == "auto" else torch.device(args.data_device),
                         max_memory_bytes=None if args.max_memory is None else int(args.max_memory * 2**30))
    try:
        summary = train(scene, cfg, options)
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
        cfg.error_density.max_gaussians = args.max_gaussians


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


def scene_for_model(model_dir: Path, source: Optional[str], eval_split: Optional[bool]):
    """Reload the capture a model was trained on, from its cfg_args (or --source)."""
    from turbogs.data.load import load_scene
    from turbogs.model import read_cfg_args

    cfg_path = model_dir / "cfg_args"
    saved = read_cfg_args(cfg_path) if cfg_path.is_file() else {}
    source = source or saved.get("source_path")
    if not source:
        raise TurboGSError(f"{model_dir}: no cfg_args names the training capture; pass --source SCENE")
    resolution = saved.get("resolution", -1)
    return load_scene(source, resolution=None if resolution in (-1, None) else int(resolution),
                      images=saved.get("images", "images"),
                      eval_split=bool(saved.get("eval", True)) if eval_split is None else eval_split,
                      white_background=bool(saved.get("white_background", False)))


def load_gaussians(model: Path, device):
    import torch

    from turbogs.gaussians import Gaussians
    from turbogs.model import load_model

    params, sh_degree, step = load_model(model)
    tensors = {k: torch.from_numpy(v) for k, v in params.items()}
    gaussians = Gaussians(tensors, sh_degree, active_sh_degree=sh_degree).to(device)
    return gaussians, step


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from turbogs.evaluate import evaluate_views, write_evaluation

    device = pick_device(args.device, args.threads)
    model_dir = Path(args.model)
    gaussians, step = load_gaussians(model_dir, device)
    scene = scene_for_model(model_dir, args.source, eval_split=True)
    if not scene.test:
        raise TurboGSError(f"{model_dir}: the capture has no test views (train with --eval)")
    background = (torch.ones(3) if scene.white_background else torch.zeros(3)).to(device)
    started = time.perf_counter()
    evaluation = evaluate_views(gaussians, scene.test, background)
    results = write_evaluation(model_dir, step or 0, evaluation, {"num_gaussians": len(gaussians)},
                               save_images=not args.no_images)
    print(f"{len(scene.test)} test views in {time.perf_counter() - started:.1f} s: PSNR {results['psnr']:.2f} dB "
          f"(colour-corrected {results['psnr_cc']:.2f}), SSIM {results['ssim']:.4f}" + (f", LPIPS {results['lpips']:.4f}" if "lpips" in results else ""))
    print(f"wrote {model_dir / 'results.json'} and {model_dir / 'per_view.json'}")
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    import torch

    from turbogs.evaluate import write_png
    from turbogs.render import render

    device = pick_device(args.device, args.threads)
    model_dir = Path(args.model)
    gaussians, step = load_gaussians(model_dir, device)
    scene = scene_for_model(model_dir, args.source, eval_split=args.split != "all")
    cameras = {"train": scene.train, "test": scene.test, "all": scene.train}[args.split]
    out_dir = Path(args.out) if args.out else model_dir / args.split / f"ours_{step or 0}" / "renders"
    background = (torch.ones(3) if scene.white_background else torch.zeros(3)).to(device)
    with torch.no_grad():
        for camera in cameras:
            write_png(out_dir / f"{Path(camera.name).stem}.png", render(gaussians, camera, background=background).image)
    print(f"rendered {len(cameras)} {args.split} views to {out_dir}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from turbogs.model import load_model
    from turbogs.ply import write_ply, write_splat

    params, sh_degree, _ = load_model(Path(args.model))
    out = Path(args.output)
    if out.is_dir():
        raise TurboGSError(f"{out}: is a folder; -o takes a file name")
    if not out.parent.is_dir():
        raise TurboGSError(f"{out.parent}: no such folder")
    (write_ply if args.format == "ply" else write_splat)(out, params)
    print(f"wrote {out} ({len(params['means'])} Gaussians, {args.format}"
          f"{f', SH degree {sh_degree}' if args.format == 'ply' else ', SH DC colors only'})")
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from turbogs.viewer import serve_model

    serve_model(args.model, host=args.host, port=args.port, block=True)
    return 0


# --- parser -------------------------------------------------------------------------


def add_device(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where to compute: cuda uses gsplat's kernels, cpu the torch twins (default: auto)")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="CPU threads for torch (default 1: the many small ops of the CPU path run fastest on one)")


def add_server(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0 exposes it to the network)")
    p.add_argument("--port", type=port_arg, default=DEFAULT_PORT,
                   help=f"port of the web viewer (default {DEFAULT_PORT}; the next free one if taken)")


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

    p = sub.add_parser("render", help="render a model's views to PNG files")
    p.add_argument("model", help="model folder written by `turbogs train`")
    p.add_argument("--split", choices=["test", "train", "all"], default="test", help="which views (default: test)")
    p.add_argument("--source", help="capture folder (default: the one named in the model's cfg_args)")
    p.add_argument("--out", "-o", help="folder for the PNGs (default: MODEL/<split>/ours_N/renders)")
    add_device(p)
    p.set_defaults(func=cmd_render)

    p = sub.add_parser("export", help="export a model as .ply (INRIA) or .splat (web viewers)")
    p.add_argument("model", help="model folder, or a .ply file")
    p.add_argument("--format", choices=["ply", "splat"], default="ply", help="output format (default: ply)")
    p.add_argument("--output", "-o", required=True, help="file to write")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("view", help="look at a model in the browser")
    p.add_argument("model", help="model folder, or a .ply file")
    add_server(p)
    p.set_defaults(func=cmd_view)

    from turbogs.bench import add_bench_parser

    add_bench_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)  # argparse itself exits 2 with one line on a bad flag
    args.argv = argv  # the command as typed, for the records benchmarks keep
    try:
        return args.func(args)
    except TurboGSError as exc:
        print(f"turbogs {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"turbogs {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
