"""`turbogs bench`: train presets side by side and compare their time to quality.

Every preset trains on the same scene load (same train/test split, resolution and seed)
with the same `Trainer` that `turbogs train` uses. Only the training steps are timed:
building the trainer, evaluating and writing files are outside the clock, and on CUDA
the clock is read only after the GPU has finished the step. At fixed points of the run
the test views are evaluated (PSNR, SSIM, and LPIPS when its weights are on disk).

Two ways to size a run, each preset configured as `turbogs train --preset P` with the
same flag would be:

- `--steps N`: a step-based run, every schedule scaled to N steps
  (`TrainConfig.scaled_to(N)`, no time budget); evaluations every N/K steps.
- `--budget-seconds S`: the trainer's time budget (`TrainConfig.budget_seconds`): the
  schedules follow the fraction of the S seconds spent, and the run ends after S
  seconds of training time (or at the preset's step cap, if that comes first).
  Evaluations when the training time passes S/K, 2S/K, ..., S.

A preset named `P@N` runs N steps whatever the bench's sizing (`turbo,3dgs@7000`: turbo's
time budget against 3DGS at 7k steps); "speedup vs run" then says how much sooner turbo
had what 3DGS ended with. `P+ABLATION` switches one TurboGS part off (config.ABLATIONS).
`--set FIELD=VALUE` changes any training setting on every preset before the run is sized
(settings.py), so that a variant of a preset needs no preset, flag or script of its own; the
settings are recorded in bench.json and bench.md. The scene may be given in the form every
benchmark script takes (scenes.py): PATH[:r=R][:w].

Outputs in --out: bench.json, bench.md (tables) and psnr_vs_time.png (one curve per
preset, drawn with OpenCV). bench.json also holds each preset's config as trained and its
Gaussian count over the run (counts.py, read through the trainer's StepObserver).
`--step-cost` instead measures seconds per render + loss + backward with 100%, 50% and 25%
of the tiles rendered (step_cost.json).

Peak memory is the growth over what was in use before the preset started: on CUDA
torch's peak allocated bytes; on the CPU the peak resident set size, sampled after
every step and evaluation (the kernel's own peak, VmHWM, cannot be reset between
presets). On the CPU it is approximate: memory freed by an earlier preset can be reused
by the allocator without showing as growth.

Modules: race.py (the presets run one after another, timed and metered), report.py (time to PSNR, speedups,
bench.md), plot.py (psnr_vs_time.png), settings.py (--set), scenes.py (the scene form),
counts.py (the Gaussian count over a run), step_cost.py (--step-cost), step_trainer.py (a trainer
placed inside a run, for single-step measurements), audit.py (--step-audit); the flags are
turbogs/cli/bench.py.
"""

from turbogs.bench.plot import CURVE_COLORS, PLOT_SIZE, draw_psnr_plot, nice_ticks
from turbogs.bench.report import PSNR_TOLERANCE_DB, markdown_report, speedups, time_to_psnr
from turbogs.bench.race import BenchSettings, parse_presets, race_presets, split_steps
from turbogs.bench.scenes import SceneSpec, parse_scene_spec
from turbogs.bench.settings import apply_settings, config_record
from turbogs.bench.step_cost import random_tile_mask, run_step_cost
from turbogs.bench.step_trainer import replicated_gaussians

__all__ = [
    "BenchSettings", "CURVE_COLORS", "PLOT_SIZE", "PSNR_TOLERANCE_DB", "SceneSpec", "apply_settings",
    "config_record", "draw_psnr_plot", "markdown_report", "nice_ticks", "parse_presets", "parse_scene_spec",
    "random_tile_mask", "replicated_gaussians", "race_presets", "run_step_cost", "speedups", "split_steps",
    "time_to_psnr",
]
