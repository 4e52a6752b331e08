"""A training run from start to finish: memory and output-folder checks, the trainer (new or
resumed from the newest checkpoint), the files SIBR wants before training, then `Trainer.run`.

With several ranks every rank calls `train`; rank 0 alone checks, locks and writes the output
folder, and a failure on any rank before training stops every rank with one message
(`World.agree`), so a rank never waits forever for one that has already given up.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from turbogs.data.scene import Scene
from turbogs.errors import TurboGSError
from turbogs.formats import model_folder as model
from turbogs.training import checkpoint
from turbogs.training.config import TrainConfig
from turbogs.training.outdir import MIN_FREE_BYTES, check_output_dir, exclusive_output
from turbogs.training.preflight import check_memory, disk_bytes_needed
from turbogs.training.trainer import RunOptions, Trainer


def write_model_preamble(scene: Scene, cfg: TrainConfig, opt: RunOptions) -> None:
    """The files SIBR wants before training: cfg_args, cameras.json, input.ply."""
    out = Path(opt.out_dir)
    model.write_cfg_args(out, scene, cfg.sh_degree, opt.images, opt.resolution, opt.eval_split)
    model.write_cameras_json(out, scene.cameras)
    if scene.points is not None and len(scene.points):
        colors = scene.point_colors if scene.point_colors is not None else np.full_like(scene.points, 0.5)
        model.write_input_ply(out, scene.points, colors)


def train(scene: Scene, cfg: TrainConfig, opt: RunOptions) -> dict:
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
        return trainer.run()


def prepare(scene: Scene, cfg: TrainConfig, opt: RunOptions, held: contextlib.ExitStack) -> Trainer:
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
        finished = model.latest_iteration(out)
        if finished is not None and not opt.overwrite:
            raise TurboGSError(
                f"{out}: already holds a trained model (iteration {finished}); use --resume to continue, "
                "--overwrite to replace it, or another --out"
            )
        if finished is not None:  # --overwrite: old checkpoints must not outrank the new run's
            checkpoint.remove_checkpoints(out)
        write_model_preamble(scene, cfg, opt)
    return trainer
