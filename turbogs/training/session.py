"""A training session from start to finish: memory and output-folder checks, the trainer (new or
resumed from the newest checkpoint), the files SIBR wants before training, `Trainer.train`, then
the checkpoint and the model, and the evaluation on the test views.

With several ranks every rank calls `train`; rank 0 alone checks, locks and writes the output
folder, and a failure on any rank before training stops every rank with one message
(`World.agree`), so a rank never waits forever for one that has already given up.

SIGTERM and Ctrl-C, from the first step to the last write of the model, stop the run at a step
every rank agrees on and save it (training/stop.py); a run stopped before its end is marked in
the model folder, and `--resume` continues it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import numpy as np

from turbogs.data.scene import Scene
from turbogs.errors import TurboGSError
from turbogs.evaluate import evaluate_views, write_evaluation
from turbogs.formats import model_folder as model
from turbogs.training import checkpoint
from turbogs.training.config import TrainConfig
from turbogs.training.outdir import MIN_FREE_BYTES, check_output_dir, exclusive_output
from turbogs.training.preflight import check_memory, disk_bytes_needed
from turbogs.training.stop import StopRequest, StopSignals
from turbogs.training.trainer import SessionOptions, Trainer


def write_model_preamble(scene: Scene, cfg: TrainConfig, opt: SessionOptions) -> None:
    """The files SIBR wants before training: cfg_args, cameras.json, input.ply."""
    out = Path(opt.out_dir)
    model.write_cfg_args(out, scene, cfg.sh_degree, opt.images, opt.resolution, opt.eval_split, cfg.antialiased,
                         cfg.parts())
    model.write_cameras_json(out, scene.cameras)
    if scene.points is not None and len(scene.points):
        colors = scene.point_colors if scene.point_colors is not None else np.full_like(scene.points, 0.5)
        model.write_input_ply(out, scene.points, colors)


def train(scene: Scene, cfg: TrainConfig, opt: SessionOptions) -> dict:
    """Train `scene` into `opt.out_dir`; returns the summary (and metrics when evaluated).
    With several ranks, every rank calls this; rank 0 checks and writes the output folder,
    and a failure on any rank before training stops every rank with one message."""
    with contextlib.ExitStack() as held:
        failure = None
        try:
            trainer = prepare(scene, cfg, opt, held)
        except TurboGSError as exc:
            failure = exc
        opt.world.agree(failure)
        if opt.resume:
            trainer.log(f"resuming from step {trainer.step} of {cfg.steps}")
        if opt.device.type == "cuda":
            trainer.log("warming up the CUDA kernels (untimed)")
            trainer.warm_up()
        with StopSignals() as signals:
            request = trainer.train(signals)
            summary = save(trainer, request)
        return evaluate(trainer, summary, request)  # a signal now ends the process as usual: all is saved


def prepare(scene: Scene, cfg: TrainConfig, opt: SessionOptions, held: contextlib.ExitStack) -> Trainer:
    """Check memory and the output folder (rank 0 locks it, in `held`), build the trainer, and
    resume it (every rank reads the same checkpoint) or start the model folder (rank 0)."""
    out, world = Path(opt.out_dir), opt.world
    estimate = check_memory(scene, cfg, opt.device, opt.data_device, opt.max_memory_bytes)
    if world.is_main:
        check_output_dir(out, min_free_bytes=max(MIN_FREE_BYTES, disk_bytes_needed(estimate, cfg.sh_degree, checkpoint.KEEP)))
        held.enter_context(exclusive_output(out))
    trainer = Trainer(scene, cfg, opt)
    if opt.resume:
        state = checkpoint.load_latest_checkpoint(out, warn=trainer.log)
        if state is None:
            raise TurboGSError(f"{out}: --resume given but no checkpoint found in {checkpoint.checkpoint_dir(out)}")
        trainer.load_state_dict(state)
    elif world.is_main:
        finished, stopped = model.latest_iteration(out), model.stopped_mark(out)
        if finished is not None and not opt.overwrite:
            held = (f"a run stopped ({stopped['stopped_by']}) at step {finished}, {stopped['progress']:.0%} done"
                    if stopped else f"a trained model (iteration {finished})")
            raise TurboGSError(f"{out}: already holds {held}; use --resume to continue, --overwrite to replace it, "
                               "or another --out")
        if finished is not None:  # --overwrite: old checkpoints must not outrank the new run's
            checkpoint.remove_checkpoints(out)
        write_model_preamble(scene, cfg, opt)
    return trainer


def save(trainer: Trainer, request: Optional[StopRequest]) -> dict:
    """Rank 0 writes the checkpoint, then the model (marked when the run stopped before its end);
    the other ranks wait, then every rank leaves the process group together: none exits while
    rank 0 still writes (a launcher stops the other ranks when one exits on a signal), and none
    leaves while another still holds the group (that can abort in gloo's teardown). Rank 0 then
    evaluates with no rank waiting on it (a collective's timeout would cut a long evaluation
    short). A write that fails (a full disk) is one error on every rank, and the files it would
    have replaced stay. Returns the summary, with `stopped_by` (the run ended early) and `signal`
    (the exit code follows it)."""
    summary, world = trainer.summary(), trainer.world
    stopped = request if request is not None and trainer.progress() < 1.0 else None
    if stopped is not None:
        summary["stopped_by"] = stopped.reason
    if request is not None and request.by_signal:
        summary["signal"] = request.reason
    failure = None
    if world.is_main:
        try:
            trainer.save_checkpoint()  # first: what --resume needs
            appearance = trainer.appearance  # the per-photo corrections; the model itself stays uncorrected
            model.write_model(trainer.options.out_dir, trainer.step,
                              {k: v.cpu().numpy() for k, v in trainer.gaussians.raw().items()},
                              stopped=None if stopped is None else {"stopped_by": stopped.reason,
                                                                    "progress": round(trainer.progress(), 4)},
                              appearance=None if appearance is None else
                              appearance.as_json([c.name for c in trainer.scene.train]))
        except TurboGSError as exc:
            failure = exc
    world.agree(failure)
    world.close()
    return summary


def evaluate(trainer: Trainer, summary: dict, request: Optional[StopRequest]) -> dict:
    """Rank 0 scores the test views, unless a signal asked the run to end: its grace period is
    for saving, and `turbogs eval` scores the model later."""
    opt = trainer.options
    if not (trainer.world.is_main and opt.evaluate and trainer.scene.test) or (request and request.by_signal):
        return summary
    evaluation = evaluate_views(trainer.gaussians, trainer.scene.test, trainer.background, trainer.log)
    return write_evaluation(Path(opt.out_dir), trainer.step, evaluation, summary, opt.save_test_images)
