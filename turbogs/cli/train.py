"""`turbogs train SCENE`: a capture into an INRIA-layout model folder, on one process or
several ranks (--nproc, torchrun)."""

from __future__ import annotations

import argparse
from pathlib import Path

from turbogs.cli.args import (add_device, add_server, add_torch_twins, positive_float, positive_int, resolution_arg,
                              share_arg)
from turbogs.cli.sfm import add_sfm_flags, sfm_options
from turbogs.device import pick_device
from turbogs.errors import TurboGSError


def add_parser(subcommands) -> None:
    p = subcommands.add_parser("train", help="train a capture (COLMAP or transforms.json) into a model folder",
                       description="Train a capture into an INRIA-layout model folder.")
    _capture_flags(p)
    _run_length_flags(p)
    add_device(p)
    add_torch_twins(p)
    p.add_argument("--seed", type=int, default=0, help="random seed; a seeded CPU run is reproducible (default 0)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a finished model in --out (the old one stays until the new one is written)")
    _model_flags(p)
    _checkpoint_flags(p)
    _memory_flags(p)
    _ablation_flags(p)
    _rank_flags(p)
    _viewer_flags(p)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _capture_flags(p: argparse.ArgumentParser) -> None:
    """What to train on: the capture, its images, split and background."""
    p.add_argument("scene", help="capture folder: COLMAP (sparse/ + images/) or transforms.json / NeRF-synthetic; "
                                 "or a folder of photos, or a video, which get their cameras from SfM first "
                                 "(turbogs sfm; needs the capture extra)")
    p.add_argument("--out", "-o", "-m", help="model folder to write (default: output/<scene name>)")
    p.add_argument("-r", "--resolution", type=resolution_arg,
                   help="downscale factor 1|2|4|8, or a target width in px (default: full size, capped at 1600 px wide)")
    p.add_argument("--images", default="images", help="image folder inside the capture (default: images)")
    p.add_argument("--eval", action="store_true",
                   help="hold out every 8th image (name order) as a test view and report PSNR/SSIM at the end")
    p.add_argument("--white-background", "-w", action="store_true", help="composite RGBA images on white, render on white")
    p.add_argument("--random-background", action=argparse.BooleanOptionalAction, default=None,
                   help="photos with alpha (RGBA): train each view over a random colour, the photo composited onto "
                        "it, so that empty space is learned as empty (default: on for turbo, off for 3dgs)")
    sfm_group = p.add_argument_group("photos or a video (SfM, as turbogs sfm; ignored for a capture with cameras)")
    add_sfm_flags(sfm_group)


def _run_length_flags(p: argparse.ArgumentParser) -> None:
    """The recipe and how long it runs."""
    p.add_argument("--preset", default="turbo", choices=["turbo", "3dgs"],
                   help="training recipe: turbo (error-guided sparse tiles, the tile NCC loss, error-driven density, "
                        "coarse to fine, Adam; a 100 s budget) or 3dgs (vanilla INRIA baseline, 30000 steps) "
                        "(default: turbo)")
    p.add_argument("--steps", type=positive_int,
                   help="number of optimisation steps (default: the preset's); alone, it replaces the time budget")
    p.add_argument("--budget-seconds", type=positive_float, metavar="S",
                   help="train for S seconds of training time; every schedule follows the elapsed fraction "
                        "(default: 100 for turbo, none for 3dgs)")


def _model_flags(p: argparse.ArgumentParser) -> None:
    """What the model may hold."""
    p.add_argument("--sh-degree", type=int, choices=[0, 1, 2, 3], help="maximum spherical-harmonics degree (default 3)")
    p.add_argument("--init-points", type=positive_int,
                   help="initial points along the camera rays when the capture has none (default: sized for the run from the "
                        "images' pixels, the device and the budget; 100000 for 3dgs)")
    p.add_argument("--background-points", type=share_arg, metavar="SHARE",
                   help="a capture with points: points for the sky and far background, as a share of its points, on "
                        "the photos' rays at 2x to 20x the subject's distance; 0: none (default: 0.2 for turbo, 0 for 3dgs)")
    p.add_argument("--max-gaussians", type=positive_int,
                   help="never grow beyond this many Gaussians (with --density mcmc: the count it grows to)")
    p.add_argument("--antialiased", action="store_true",
                   help="Mip-Splatting's 2D filter with opacity compensation (gsplat's antialiased mode): no "
                        "shimmer or thickening when viewed smaller or farther away; eval, render and view use it too")
    p.add_argument("--appearance", action="store_true",
                   help="learn a colour transform (3x3 + bias) per training photo, for photos that differ in exposure "
                        "and white balance; test views, viewer and exports show the uncorrected model")


def _checkpoint_flags(p: argparse.ArgumentParser) -> None:
    """How often a resumable checkpoint is written."""
    p.add_argument("--checkpoint-every", type=float, metavar="SECONDS",
                   help="write a resumable checkpoint this often, in seconds of wall time (default 60)")
    p.add_argument("--checkpoint-every-steps", type=positive_int, metavar="N",
                   help="also write a checkpoint every N steps (default: by wall time only)")


def _memory_flags(p: argparse.ArgumentParser) -> None:
    """Where the images live, and the memory a run may ask for."""
    p.add_argument("--data-device", choices=["auto", "cpu"], default="auto",
                   help="where the training images live: auto = with the model, cpu = in CPU memory, moved to the "
                        "GPU one view per step (saves GPU memory on large captures)")
    p.add_argument("--max-memory", type=positive_float, metavar="GB",
                   help="refuse to start when the memory estimate exceeds GB gibibytes per device "
                        "(rehearse a smaller machine; default: what the device has free)")


def _ablation_flags(p: argparse.ArgumentParser) -> None:
    """Single TurboGS parts switched off or swapped, on top of any preset."""
    p.add_argument("--no-sparse", action="store_true", help="ablation: render every tile of every step")
    p.add_argument("--no-ncc", action="store_true", help="ablation: drop the NCC structure term from the tile loss")
    p.add_argument("--density", choices=["3dgs", "error", "mcmc"],
                   help="density control: INRIA's gradient rule, error-driven, or 3DGS-MCMC (relocation under a fixed cap)")
    p.add_argument("--optimizer", choices=["adam", "hybrid"],
                   help="Adam (3dgs's), or the hybrid Hessian-informed/Adam optimizer (turbo's)")


def _rank_flags(p: argparse.ArgumentParser) -> None:
    """Several views per step: ranks (--nproc) and views per rank."""
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


def _viewer_flags(p: argparse.ArgumentParser) -> None:
    """The live viewer."""
    p.add_argument("--viewer", action="store_true", help="watch training live in the browser")
    add_server(p)
    p.add_argument("--no-block", action="store_true", help="with --viewer: exit when training ends instead of serving on")



def run(args: argparse.Namespace) -> int:
    import torch

    from turbogs.distributed import world as distributed

    if not distributed.launched_by_torchrun():
        from_photos(args)  # under --nproc: here, once, before the ranks start
        if args.nproc > 1:
            from turbogs.distributed.launch import run_ranks, strip_nproc
            from turbogs.training.checkpoint import checkpoint_dir

            return run_ranks(args.nproc, strip_nproc(args.argv), checkpoints=str(checkpoint_dir(out_dir_of(args))))
    device = pick_device(args.device, args.threads)
    world = distributed.join(device.type, timeout_minutes=24 * 60 if args.viewer else 30)
    if world.size > 1 and device.type == "cuda":
        device = torch.device("cuda", world.local_rank)
    try:
        if world.size > 1:
            from_photos_on_ranks(args, world)
        return train_as_rank(args, world, device, out_dir_of(args))
    finally:
        world.close()


def out_dir_of(args: argparse.Namespace) -> Path:
    return Path(args.out) if args.out else Path("output") / Path(args.scene).resolve().name


def from_photos(args: argparse.Namespace, sfm_here: bool = True, log=print) -> None:
    """A folder of photos or a video: SfM first (or the model of an earlier run), then train on it."""
    from turbogs.capture.prepare import needs_capture, prepare

    if not needs_capture(Path(args.scene)):
        return
    done = prepare(Path(args.scene), frames=args.frames, options=sfm_options(args), sfm_here=sfm_here, log=log)
    args.scene = str(done.scene)
    if done.images is not None and args.images == "images":
        args.images = done.images


def from_photos_on_ranks(args: argparse.Namespace, world) -> None:
    """from_photos on several ranks: rank 0 alone runs the SfM (several would race on one folder and
    could find different cameras) while the others wait, in a group whose wait outlasts a long SfM;
    then they read its model. A failure on any rank stops every rank, rank 0 saying why once.
    Under --nproc the launcher ran the SfM already, and said so: rank 0 only finds its model."""
    import os

    from turbogs.distributed.world import LAUNCHED_BY_TURBOGS

    group = world.waiting_group(minutes=7 * 24 * 60)
    failure = None
    if world.is_main:
        try:
            from_photos(args, log=(lambda line: None) if os.environ.get(LAUNCHED_BY_TURBOGS) else print)
        except TurboGSError as exc:
            failure = exc
    world.agree(failure, group=group)
    if not world.is_main:
        try:
            from_photos(args, sfm_here=False, log=lambda line: None)
        except TurboGSError as exc:
            failure = exc
    world.agree(failure)


def train_as_rank(args: argparse.Namespace, world, device, out_dir: Path) -> int:
    """`turbogs train` on one process, or on one rank of several (rank 0 alone speaks and writes)."""
    import torch

    from turbogs import kernels
    from turbogs.data.load import load_scene
    from turbogs.training.config import get_preset
    from turbogs.training.session import train
    from turbogs.training.stop import signal_exit_code
    from turbogs.training.trainer import SessionOptions

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

        viewer = LiveViewer(scene.train, host=args.host, port=args.port, control=args.viewer_control,
                            antialiased=cfg.antialiased)
    options = SessionOptions(out_dir=out_dir, device=device, resume=args.resume, overwrite=args.overwrite,
                         evaluate=True, progress=not args.quiet, images=args.images,
                         resolution=args.resolution or -1, eval_split=args.eval, viewer=viewer,
                         data_device=None if args.data_device == "auto" else torch.device(args.data_device),
                         max_memory_bytes=None if args.max_memory is None else int(args.max_memory * 2**30),
                         world=world)
    try:
        summary = train(scene, cfg, options)
        code = signal_exit_code(summary["signal"]) if "signal" in summary else 0  # 143, 130: as a shell reports it
        if not world.is_main:
            return code
        report(summary, out_dir)
        if code:
            return code
        if viewer is not None:
            from turbogs.formats.model_folder import latest_iteration, point_cloud_path
            from turbogs.formats.ply import read_ply

            params, _ = read_ply(point_cloud_path(out_dir, latest_iteration(out_dir)))
            viewer.finish(params, block=not args.no_block)  # blocking: serves until Ctrl-C
    finally:
        if viewer is not None:
            viewer.close()  # --no-block, or training failed: free the port, end the threads, exit
    return 0


def apply_ablations(cfg, args: argparse.Namespace) -> None:
    """Switch single TurboGS parts off (or swap them) on top of any preset."""
    from turbogs.training.config import ABLATIONS

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
    if args.antialiased:
        ABLATIONS["antialiased"](cfg)
    if args.random_background is not None:
        cfg.random_background = args.random_background
    if args.background_points is not None:
        cfg.background_points = args.background_points


def report(summary: dict, out_dir: Path) -> None:
    from turbogs.evaluate import metrics_line

    figures = f"{summary['steps']} steps in {summary['train_seconds']:.1f} s, {summary['num_gaussians']} Gaussians"
    if "stopped_by" in summary:
        line = (f"stopped ({summary['stopped_by']}): {figures}; the checkpoint and the model are saved, "
                "and the same command with --resume continues the run")
    else:
        line = f"done: {figures}"
    if "psnr" in summary:
        line += f"; test {metrics_line(summary)}"
    print(line)
    if "signal" in summary and "stopped_by" not in summary:
        print(f"{summary['signal']} came as training ended: the model is complete but not evaluated "
              f"(turbogs eval {out_dir})")
    print(f"model: {out_dir}  (INRIA layout: point_cloud/, cameras.json, cfg_args"
          f"{', results.json' if 'psnr' in summary else ''})")
    print(f"view it: turbogs view {out_dir}")
