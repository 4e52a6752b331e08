"""The training loop.

One step is the algorithm of the paper, in order:

    pick views -> for each: render it -> photometric loss -> backward -> density statistics
    -> sum over the ranks -> error memory -> optimizer step -> density control (grow/prune on schedule)

A step trains one view, or several: `--batch-views B` on one process, `--nproc R` ranks of B
views each (turbogs/distributed/multiview.py says how the views are shared out and summed).

Around it: learning-rate and SH schedules, a progress bar, and checkpoints by wall
clock (so a killed run can `--resume`). SIGTERM, Ctrl-C and the viewer's Stop end the loop
early, at a step every rank agrees on (training/stop.py). training/session.py then writes the model
in INRIA's layout and evaluates it on the test views.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import torch

from turbogs import kernels
from turbogs.data.scene import Scene
from turbogs.density.base import DensityStep
from turbogs.distributed.multiview import ViewResult, combine, rank_slots, slot_generator
from turbogs.distributed.world import LOCAL, World, parameter_checksum
from turbogs.errors import TurboGSError
from turbogs.metrics import sampled_psnr_tensor
from turbogs.optim.base import load_keeping_settings
from turbogs.render import render
from turbogs.tiles import TILE_SIZE, sampled_pixel_values, tile_grid
from turbogs.training import checkpoint
from turbogs.training.appearance import Appearance, load_appearance
from turbogs.training.bar import TrainingBar
from turbogs.training.clock import StepClock, synchronize, timed
from turbogs.training.config import TrainConfig
from turbogs.training.observer import StepObserver
from turbogs.training.progress import WorkProgress
from turbogs.training.running_stats import RunningStats
from turbogs.training.sizes import TrainingSizes, run_stages
from turbogs.training.step_costs import fastest_in_rounds
from turbogs.training.start import initial_gaussians, make_optimizers
from turbogs.training.stop import StopAgreement, StopRequest, StopSignals
from turbogs.training.views import TrainingViews, ViewOrder, photo_alphas
from turbogs.turbo import ErrorMemory, TileLoss, TileSample, TileSampler
from turbogs.turbo.losses import photometric_loss

MAX_BAD_STEPS = 50  # consecutive non-finite steps before giving up
BAR_REFRESH_SECONDS = 0.5  # the progress bar's figures are read from the device this often
# With several ranks, every rank reads the figures (and may stop a diverged run) at the same
# steps, and compares a checksum of the parameters every CHECKSUM_EVERY steps.
RANKS_READ_EVERY = 20
CHECKSUM_EVERY = 100
# torch >= 2.5 names it torch.OutOfMemoryError; torch.cuda.OutOfMemoryError is the same class.
OUT_OF_MEMORY = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


@dataclass
class SessionOptions:
    """Where and how to run, as opposed to *what* to train (TrainConfig)."""

    out_dir: Path
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    data_device: Optional[torch.device] = None  # where the images live; None = `device`. CPU: moved per step
    max_memory_bytes: Optional[int] = None  # --max-memory: pretend a device has no more than this
    resume: bool = False
    overwrite: bool = False
    evaluate: bool = True  # evaluate on the scene's test views at the end
    save_test_images: bool = True
    progress: bool = True
    images: str = "images"
    resolution: int = -1
    eval_split: bool = False
    viewer: Optional[object] = None  # a turbogs.viewer.LiveViewer (rank 0's)
    log: Callable[[str], None] = print
    world: World = LOCAL  # this process's rank among the ranks of a data-parallel run


# --- building blocks --------------------------------------------------------------


def means_lr(progress: float, cfg: TrainConfig, extent: float) -> float:
    """INRIA's exponential decay of the position learning rate over the run."""
    t = min(max(progress, 0.0), 1.0)
    start, end = cfg.lr.means * extent, cfg.lr.means_final * extent
    return math.exp((1 - t) * math.log(start) + t * math.log(end))


# --- the run ----------------------------------------------------------------------


class Trainer:
    """Holds the state of one run; `train()` is the loop."""

    def __init__(self, scene: Scene, cfg: TrainConfig, options: SessionOptions):
        if not scene.train:
            raise TurboGSError(f"{scene.source_path}: no training views")
        self.scene, self.cfg, self.options = scene, cfg, options
        self.device = options.device
        self.world = options.world
        self.log = options.log if self.world.is_main else (lambda message: None)
        self.views_per_step = self.world.size * cfg.batch_views
        if cfg.world_size != self.world.size:
            raise TurboGSError(f"the training settings were sized for {cfg.world_size} ranks, this run has "
                               f"{self.world.size} (TrainConfig.for_run(..., world_size=))")
        if self.views_per_step > len(scene.train):
            raise TurboGSError(f"{self.world.size} rank(s) x {cfg.batch_views} view(s) = {self.views_per_step} "
                               f"views per step, but the capture has {len(scene.train)} training views: "
                               "use fewer --nproc or --batch-views")
        # Before the clock: a missing CUDA kernel is one clear error now, not at step 1; the CPU's
        # native kernels are compiled now (once per machine), or one line says the twins run.
        kernels.prepare_kernels(self.device, self.log)
        self.extent = scene.extent()
        self.generator = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        self.background = scene.background(self.device)
        data_device = options.data_device or self.device
        self.train_views = TrainingViews(scene.train, [c.image.to(data_device) for c in scene.train],
                                         [None if c.mask is None else c.mask.to(data_device) for c in scene.train],
                                         self.device, background=self.background, seed=cfg.seed,
                                         alphas=photo_alphas(scene.train, data_device) if cfg.random_background else None)
        self.gaussians = initial_gaussians(scene, cfg, self.generator, self.device.type, self.log).to(self.device)
        self.optimizers = make_optimizers(self.gaussians, cfg, self.extent)
        if not cfg.sampler.tile_size == cfg.tile_loss.tile_size == TILE_SIZE:
            raise TurboGSError(f"sampler and tile loss must use the renderer's {TILE_SIZE}-pixel tiles, got "
                               f"{cfg.sampler.tile_size} and {cfg.tile_loss.tile_size}")
        self.density = cfg.density.build()
        self.density_state = self.density.initial_state(len(self.gaussians), device=self.device)
        self.views = ViewOrder(len(scene.train), self.generator)
        if cfg.error_guided:
            self.memory = ErrorMemory.from_cameras(scene.train, cfg.sampler, self.device)
            self.sampler = TileSampler(self.memory, cfg.sampler, seed=cfg.seed)
            self.tile_loss = TileLoss(cfg.tile_loss)
        else:
            self.memory = self.sampler = self.tile_loss = None
        self.appearance = Appearance(len(scene.train), cfg.appearance, self.device) if cfg.appearance.enabled else None
        self.stats = RunningStats()
        self.longest_bad_streak = 0  # the longest run of skipped steps read since the last check
        self.step = 0
        self.elapsed = 0.0  # training seconds, excluding evaluation and checkpoint writes
        self.observer = StepObserver()
        self.clock = StepClock(self.device)
        # Coarse to fine: the training sizes, their views made from the requested size's.
        stages = run_stages(cfg, self.train_views)
        self.work = WorkProgress(cfg.steps, cfg.budget_seconds, stages)
        self.sizes, self.size_factor = TrainingSizes(cfg, self.train_views, self.work), 1
        self.use_size(stages[0].factor)
        if cfg.coarse_to_fine.enabled:
            self.log(self.sizes.first_line())

    def progress(self) -> float:
        """Fraction of the run done: of the steps, or, with a time budget, of the steps the
        budget will have made at the recent pace (training/progress.py)."""
        return self.work.at(self.step, self.elapsed)

    # --- one step -----------------------------------------------------------------
    def train_step(self) -> None:
        """pick views -> each: render, loss, backward -> sum over the ranks -> error memory
        -> optimizer -> density control."""
        cfg, progress = self.cfg, self.progress()
        self.apply_schedules(progress)

        picks = self.pick(progress)  # the step's views, one shared draw; this rank trains its slots of it
        backgrounds = self.train_views.backgrounds(self.step, len(picks))
        slots = rank_slots(self.world, cfg.batch_views)
        views = [self.train_view(picks[slot], backgrounds[slot], progress, slot) for slot in slots]
        step = combine(views, self.world, self.trainable_parameters(), self.density.reductions,
                       [] if self.memory is None else [pick.tile_ids.numel() for pick in picks], cfg.batch_views,
                       self.gaussians.gradient_columns())

        # A step with a non-finite loss or gradient changes nothing. Whether it is one stays
        # on the device (`ok`): every update below is masked by it, and the skipped steps are
        # counted there and read when the figures are (read_device_figures).
        ok = self._finite(step.loss)
        with torch.no_grad():
            if self.memory is not None:  # the memory ignores non-finite tile errors
                for pick, tile_errors in zip(picks, step.tile_errors):
                    self.memory.update(pick.view, pick.tile_ids, torch.where(ok, tile_errors, float("nan")))
            cfg.optimizer.step(self.optimizers, step.visible, step.curvature, ok)
            if self.appearance is not None:
                self.appearance.step(ok)
            self.density.accumulate(self.density_state, step.statistics, ok)
            density_stats = self.density.control(self.density_state, DensityStep(
                self.step + 1, progress, self.gaussians, self.optimizers, scene_extent=self.extent, ok=ok,
                pixel_share=self.size_factor ** -2))
            self.observer.density(density_stats)
            self.stats.update(step.loss, step.psnr, density_stats, ok)

    def train_view(self, pick: TileSample, background: torch.Tensor, progress: float, slot: int) -> ViewResult:
        """Render one view, its loss and backward pass (gradients add up in .grad), and its
        density statistics."""
        cfg = self.cfg
        camera, gt, mask = self.train_views.get(pick.view, background)  # pick.view: an int, or an index on the device
        features = self.density.render_features(len(self.gaussians), progress, self.device)  # e.g. the blame probe

        with self.observer.render():
            out = render(self.gaussians, camera, background=background, tile_mask=pick.tile_mask, extra_features=features)
        image = out.image if self.appearance is None else self.appearance(out.image, pick.view)  # as this photo shows it
        if self.tile_loss is not None:
            loss, tile_errors = self.tile_loss(image, gt, pick.tile_ids, mask)
        else:
            loss, tile_errors = photometric_loss(image, gt, mask, cfg.loss.lambda_ssim), None
        if self.appearance is not None:
            loss = loss + self.appearance.regularizer(pick.view)
        extra = self.density.extra_loss(out, image, gt, pick.tile_mask, mask, pick.tile_ids)  # e.g. the blame (value 0)
        if extra is not None:
            loss = loss + extra
        regularizer = self.density.regularizer(self.gaussians)  # e.g. MCMC's opacity and scale terms
        if regularizer is not None:
            loss = loss + regularizer
        # First-order curvature: a backward pass with random residuals, from the shared stream
        # when the step has one view, else from the slot's own.
        generator = self.generator if self.views_per_step == 1 else slot_generator(cfg.seed, self.step, slot)
        curvature = self.estimate_curvature(out, pick, generator)
        self.density.before_backward(self.density_state, out)
        with self.observer.backward():
            (loss if self.views_per_step == 1 else loss / self.views_per_step).backward()  # the step's mean loss
        statistics = self.density.observe(self.density_state, DensityStep(
            self.step + 1, progress, self.gaussians, self.optimizers, out, camera.width, camera.height, self.extent,
            features, grad_scale=self.views_per_step))
        psnr = sampled_psnr_tensor(image, gt, pick.tile_mask, mask, pick.tile_ids)
        return ViewResult(loss.detach(), psnr, out.visible, tile_errors, curvature, statistics)

    def trainable_parameters(self) -> list:
        """Every tensor the optimizers step, in one order on every rank (for the all-reduce)."""
        params = list(self.gaussians.params.values())
        return params if self.appearance is None else params + list(self.appearance.parameters())

    def estimate_curvature(self, out, pick: TileSample, generator: torch.Generator) -> Optional[Dict[str, torch.Tensor]]:
        """When the optimizer asks for it, its curvature estimate from the rendered pixels."""
        if not self.cfg.optimizer.wants_curvature(self.step):
            return None
        pixels, alpha = (sampled_pixel_values(self.train_views.real_pixels_only(image, pick.view), pick.tile_ids)
                         for image in (out.image, out.alpha))  # not the padding; row-major, with no read
        with self.observer.backward():  # backward passes, like loss.backward()
            return self.cfg.optimizer.estimate_curvature(pixels, alpha, self.gaussians.params, generator)

    def warm_up(self) -> None:
        """Untimed, before the training clock starts: one render, loss and backward of the
        first view (every tile, so the tile loss runs too), so that the CUDA context, kernel
        loading and libraries' lazy set-up are not paid inside the first timed step. Changes
        no parameter, optimizer state, statistic or random stream."""
        self._render_backward(self.train_views)

    def _render_backward(self, views: TrainingViews) -> None:
        """One render, loss and backward of the first of `views`, every tile; no trace left."""
        camera, gt, _ = views.get(0)
        out = render(self.gaussians, camera, background=self.background)
        if self.tile_loss is not None:
            tile_rows, tile_cols = tile_grid(camera.height, camera.width)
            every_tile = torch.arange(tile_rows * tile_cols, device=self.device)
            loss, _ = self.tile_loss(out.image, gt, every_tile, None)
        else:
            loss = photometric_loss(out.image, gt, None, self.cfg.loss.lambda_ssim)
        loss.backward()
        for param in self.gaussians.params.values():
            param.grad = None
        synchronize(self.device)

    def timed_step(self) -> float:
        """One timed step: the training clock counts it, GPU work included (on CUDA by events,
        with no wait per step: the host's estimate until the figures are read; training/clock.py).
        A budget run with several sizes first measures a step's cost at its sizes, and plans them;
        a size that has had its time or steps gives way to the next. Both count in the budget."""
        if self.sizes.needs_plan:
            self.elapsed += timed(lambda: self.use_size(self.sizes.plan_budget(self._time_steps, self.step,
                                                                               self.elapsed)), self.device)
            self.log(self.sizes.summary())
        if self.work.stage_over(self.step, self.elapsed):
            self.elapsed += timed(lambda: self.use_size(self.sizes.next_size(self.step, self.elapsed,
                                                                             self.progress())), self.device)
        self.clock.start()
        self.train_step()
        self.step += 1
        seconds = self.clock.stop()
        self.elapsed += seconds
        return seconds

    # --- coarse to fine --------------------------------------------------------------
    def use_size(self, factor: int) -> None:
        """Train on the images downscaled by `factor` from now on: their views, the error memory
        carried over to their tiles, and the small sizes' render mode."""
        if factor != self.size_factor:
            self.size_factor, self.train_views = factor, self.sizes.views(factor)
        sizes = [(c.height, c.width) for c in self.train_views.cameras]
        if self.memory is not None and self.memory.image_sizes != sizes:
            self.memory = self.sampler.memory = self.memory.resized(sizes)
        small = factor > 1 and self.cfg.coarse_to_fine.antialiased_small
        self.gaussians.antialiased = self.cfg.antialiased or small

    def _time_steps(self, factors: Sequence[int]) -> Dict[int, float]:
        """Seconds of one render, loss and backward at each size, the fastest of several taken in
        rounds (training/step_costs.py says why); rank 0's, so that every rank plans the same
        sizes, after a barrier, so that no rank times while another is still setting up."""
        views = {f: self.train_views if f == self.size_factor else self.sizes.views(f) for f in factors}
        self.world.barrier()
        fastest = fastest_in_rounds(lambda f: timed(lambda: self._render_backward(views[f]), self.device), factors)
        return {factor: self.world.broadcast_float(seconds) for factor, seconds in fastest.items()}

    def apply_schedules(self, progress: float) -> None:
        """Position learning-rate decay and SH growth, both as functions of progress."""
        for group in self.optimizers["means"].param_groups:
            group["lr"] = means_lr(progress, self.cfg, self.extent)
        if self.cfg.sh_increase_fraction:
            degree = int(progress / self.cfg.sh_increase_fraction + 1e-9)
        else:
            degree = int(progress * self.cfg.steps) // self.cfg.sh_increase_every
        self.gaussians.active_sh_degree = min(degree, self.cfg.sh_degree)

    def pick(self, progress: float) -> List[TileSample]:
        """What this step trains on, every rank's views: each a view and, when sampling tiles,
        which of its tiles. Every rank draws the same (shared random streams)."""
        if self.sampler is None:
            return [TileSample(self.views.next()) for _ in range(self.views_per_step)]
        return self.sampler.sample_views(progress, self.views_per_step, view_on_device=self.train_views.stacked)

    def _finite(self, loss: torch.Tensor) -> torch.Tensor:
        """A device bool, no read: the loss and every gradient finite (the per-photo appearance
        transforms' too). The Euclidean norm of each gradient (one _foreach op; NaN and inf
        propagate through it, and a gradient so large that its squares overflow, about 1e19,
        counts as non-finite, as no healthy step has one) and the loss, tested together. The
        largest magnitude did the same 20x slower on the CPU (18 ms a step at 100k Gaussians)."""
        grads = [p.grad for p in self.trainable_parameters() if p.grad is not None and p.grad.numel()]
        peaks = list(torch._foreach_norm(grads, 2)) if grads else []
        return torch.isfinite(torch.stack([loss.detach().reshape(()), *[x.to(loss.dtype) for x in peaks]])).all()

    @property
    def bad_streak(self) -> int:
        """Non-finite steps in a row, as of the last read_device_figures()."""
        return self.stats.bad_streak

    def read_device_figures(self, final: bool = False) -> None:
        """The one place where the step's figures come to the host (bar refreshes, the viewer,
        checkpoints, the end): one read. Too many skipped steps in a row stop the run here;
        with several ranks only at steps every rank reads (RANKS_READ_EVERY, and the end), so
        that they all stop at the same step."""
        self.elapsed += self.clock.settle()  # on CUDA: the GPU's own time for the steps since the last read
        self.longest_bad_streak = max(self.longest_bad_streak, self.stats.refresh())
        if self.world.size > 1 and not final and self.step % RANKS_READ_EVERY:
            return
        longest, self.longest_bad_streak = self.longest_bad_streak, 0
        if longest >= MAX_BAD_STEPS:
            if self.world.is_main and not checkpoint.list_checkpoints(self.options.out_dir):
                # Skipped steps changed no parameter: this state is the last good one.
                self.save_checkpoint()
            message = (f"training diverged: {MAX_BAD_STEPS} steps in a row had non-finite loss or gradients "
                       f"(step {self.step}); the last good checkpoint is kept in "
                       f"{checkpoint.checkpoint_dir(self.options.out_dir)}")
            raise self.world.stop_all(message)

    # --- checkpoints --------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            "params": self.gaussians.raw(),
            "active_sh_degree": self.gaussians.active_sh_degree,
            "optimizers": {k: o.state_dict() for k, o in self.optimizers.items()},
            "density": self.density_state,
            "views": self.views.state_dict(),
            "error_memory": None if self.memory is None else self.memory.state_dict(),
            "sampler": None if self.sampler is None else self.sampler.state_dict(),
            "generator": self.generator.get_state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "elapsed": self.elapsed,
            "progress": self.work.state_dict(),
            "stats": self.stats.state_dict(),
            "appearance": None if self.appearance is None else self.appearance.state(),
        }

    def load_state_dict(self, state: dict) -> None:
        self.gaussians.replace({k: v.to(self.device) for k, v in state["params"].items()})
        self.gaussians.active_sh_degree = state["active_sh_degree"]
        self.optimizers = make_optimizers(self.gaussians, self.cfg, self.extent)
        for name, optimizer in self.optimizers.items():
            load_keeping_settings(optimizer, state["optimizers"][name])
        loaded = {k: v.to(self.device) if torch.is_tensor(v) else v for k, v in state["density"].items()}
        for key, fresh in self.density_state.items():  # a statistic the checkpoint's version did not keep: zeros
            if key not in loaded:
                loaded[key] = fresh.new_zeros((len(self.gaussians),) + tuple(fresh.shape[1:]))
        self.density_state = loaded
        self.views.load_state_dict(state["views"])
        self.work.load_state_dict(state.get("progress"))
        self.use_size(self.work.stage.factor)  # before the error memory: its tiles are this size's
        if self.memory is not None:
            self.memory.load_state_dict(state["error_memory"])
            self.sampler.load_state_dict(state["sampler"])
        self.generator.set_state(state["generator"])
        torch.set_rng_state(state["torch_rng"])
        if self.device.type == "cuda" and state.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        load_appearance(self.appearance, state.get("appearance"))
        self.elapsed = state["elapsed"]
        self.stats = RunningStats(**{"bad_streak": state.get("bad_streak", 0), **state["stats"]})
        self.step = state["step"]

    def save_checkpoint(self) -> None:
        checkpoint.save_checkpoint(self.options.out_dir, self.step, self.state_dict())

    # --- the loop -----------------------------------------------------------------
    def train(self, signals: Optional[StopSignals] = None) -> Optional[StopRequest]:
        """Train to the end, or to a stop every rank agreed on (a signal caught by `signals`, the
        viewer's Stop; training/stop.py), which it returns (also one that came too late to
        shorten the run: it still decides the exit code). training/session.py then saves."""
        cfg, world = self.cfg, self.world
        last_checkpoint = last_refresh = time.perf_counter()
        bar = TrainingBar(cfg.steps, cfg.budget_seconds, self.options.progress and world.is_main, self.step,
                          self.elapsed)
        viewer = self.options.viewer
        stop = StopAgreement(world, signals or StopSignals(), viewer, every=RANKS_READ_EVERY)
        try:
            while self.progress() < 1.0:
                if viewer is not None:
                    viewer.wait_if_paused(until=stop.signalled)
                request = stop.check(self.step)
                if request is not None:
                    self.log(request.announce(self.step, world.size))
                    return request
                try:
                    self.timed_step()
                except OUT_OF_MEMORY:
                    raise self._out_of_memory() from None
                if world.size > 1 and self.step % CHECKSUM_EVERY == 0:
                    world.check_same(parameter_checksum(self.trainable_parameters()),
                                     f"the parameters at step {self.step}")

                bar.advance(self.elapsed)
                if world.size > 1 and self.step % RANKS_READ_EVERY == 0:
                    self.read_device_figures()  # every rank, at the same steps
                if world.is_main and (time.perf_counter() - last_refresh >= BAR_REFRESH_SECONDS
                                      or self.progress() >= 1.0):
                    self.read_device_figures()
                    bar.show(self.step, self.stats.loss, self.stats.psnr, len(self.gaussians),
                             self.stats.density_figures(), self.stats.skipped_steps, self.size_text())
                    last_refresh = time.perf_counter()
                if viewer is not None:
                    viewer.update(self.step, cfg.steps, self.progress_stats(), self.gaussians.raw,
                                  None if self.memory is None else self.memory.view_error)
                if world.is_main and self._checkpoint_due(last_checkpoint):
                    self.read_device_figures()
                    self.save_checkpoint()
                    last_checkpoint = time.perf_counter()
                if world.size > 1 and cfg.budget_seconds:  # every rank follows rank 0's clock (read last:
                    self.elapsed = world.broadcast_float(self.elapsed)  # its reads above may settle it)
        finally:
            bar.close()
        return stop.check(self.step, final=True)

    def size_text(self) -> Optional[str]:
        """The training size, "270x480", while coarse to fine trains below the requested one."""
        camera = self.train_views.cameras[0]
        return None if self.size_factor == 1 else f"{camera.width}x{camera.height}"

    def _out_of_memory(self) -> TurboGSError:
        """Keep the work done so far, and say how to continue in less memory. The failed step
        counted nothing (timed_step raised before the step counter moved)."""
        for optimizer in self.optimizers.values():
            optimizer.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        self.save_checkpoint()
        return TurboGSError(
            f"out of {self.device.type} memory at step {self.step} with {len(self.gaussians)} Gaussians; "
            f"saved a checkpoint in {checkpoint.checkpoint_dir(self.options.out_dir)}. Continue with --resume plus "
            "--data-device cpu (images stay in CPU memory) or --max-gaussians N (fewer than now), "
            "or start over with -r 2/4/8 (smaller images)"
        )

    def _checkpoint_due(self, last: float) -> bool:
        cfg = self.cfg
        if cfg.checkpoint_every_steps and self.step % cfg.checkpoint_every_steps == 0:
            return True
        return cfg.checkpoint_every_seconds > 0 and time.perf_counter() - last >= cfg.checkpoint_every_seconds

    def progress_stats(self) -> dict:
        self.read_device_figures()
        return {"loss": self.stats.loss, "psnr": self.stats.psnr, "num_gaussians": len(self.gaussians),
                "elapsed": self.elapsed, "skipped_steps": self.stats.skipped_steps, **self.stats.density_figures()}

    def summary(self) -> dict:
        """The run's figures, for results.json and the last line the user reads."""
        self.read_device_figures(final=True)
        return {"num_gaussians": len(self.gaussians), "train_seconds": round(self.elapsed, 3), "steps": self.step,
                "preset": self.cfg.preset, "parts": self.cfg.parts(), "skipped_steps": self.stats.skipped_steps,
                "antialiased": self.cfg.antialiased, "training_sizes": self.work.trained(self.step, self.elapsed),
                "peak_gaussians": max(self.stats.peak_gaussians, len(self.gaussians)),
                "backend": kernels.backend_name(self.device),
                # steps count optimizer steps: views trained = steps x world_size x batch_views
                "world_size": self.world.size, "batch_views": self.cfg.batch_views,
                "views_per_second": round(self.step * self.views_per_step / max(self.elapsed, 1e-9), 3)}
