"""`turbogs bench --step-audit`: how often the trainer's own code waits for the host, and how
many ops it launches, per training step (step_audit.json).

Why: on a GPU every host read (`.item()`, `bool(t)`, a boolean-mask index, `nonzero`, ...)
stalls the host until the device's queue drains, and every op launch costs a few
microseconds of host time. A fast step has neither in its hot path. Both are counted,
not timed, so the figures are the same on a CPU and a GPU (only the renderer differs).

How: a `TorchDispatchMode` sees every aten op the step runs. The trainer hands the audit
its `StepObserver` seam (`Trainer.observer`): the counting pauses inside `render()` and
`loss.backward()`, whose ops are the rasterizer's and autograd's, not the trainer's, and
inside the hybrid optimizer's curvature estimate, which is one more backward pass (every
10th step, with random residuals). So the scope is "trainer outside render and backward". On CUDA the host reads inside
`render()` are counted too (`render_host_reads`); on the CPU the renderer is the torch
twin, whose reads say nothing about the CUDA path, so they are left out. A batched read
(`.tolist()` of several values, one wait) runs no aten op on the CPU; the step's code makes
those through `turbogs.host_read.values`, which the audit counts as one read each.

Which steps: the preset is scheduled as `bench --steps max(N, 1000)` would run it, so that
density control runs on its ordinary cadence. The first N steps are counted, and the
count goes on until two density-control steps (a step whose strategy densified or pruned)
have been seen, or the schedule ends. Density-control steps get their own figures.

Two op figures. `ops_per_step` is the raw count: on the CPU it includes every op of the
torch twins of TurboGS's own CUDA kernels (the tile loss, the error-memory update, the
view and tile sampling keys), hundreds per turbo step. `ops_per_step_cuda_estimate`
counts each call of those dispatched ops (turbogs.kernels; on the CPU the tile loss may be
native, turbo_cpu, and counts as one op too) as one op, as the CUDA path would launch it, and
everything else as counted: an estimate of the CUDA path, not a measurement (a kernel's
wrapper may launch an allocation or two more; the tile loss's, four: its weighted mean).
"""

from __future__ import annotations

import statistics
from collections import Counter
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from turbogs import host_read
from turbogs.bench.race import BenchSettings, base_config, load_bench_scene, machine_info, make_trainer
from turbogs.fileio import atomic_write_json
from turbogs.training.observer import StepObserver
from turbogs.training.outdir import check_output_dir

AUDIT_STEPS = 100  # steps counted by default
SCHEDULE_STEPS = 1000  # the run's schedule (as bench --steps 1000), so density control runs
DENSITY_STEPS_WANTED = 2  # keep counting until this many density-control steps were seen
SCOPE = "trainer outside render and backward"
TWIN_OPS = ("tile_loss", "memory_update", "view_sample_keys", "tile_sample_keys")  # turbo_torch's dispatched ops
CUDA_ESTIMATE_NOTE = ("ops_per_step_cuda_estimate: an estimate of the CUDA path, not a measurement: each call of "
                      f"TurboGS's dispatched ops (turbogs.kernels: {', '.join(TWIN_OPS)}) counts as 1 op, as the "
                      "CUDA kernel would launch it, instead of its torch twin's ops; ops_per_step is the raw count")

BATCHED_READ = "tolist (turbogs.host_read.values)"
_UNIQUE_OPS = {"_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"}
_ALWAYS_READS = {"_local_scalar_dense", "nonzero", "masked_select"} | _UNIQUE_OPS
_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"}


def _has_bool_index(indices) -> bool:
    return any(torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def host_read_name(func, args, kwargs) -> Optional[str]:
    """The op's name when it makes the host wait for the device's result, else None.

    A read: `_local_scalar_dense` (.item(), bool(t), float(t), int(t)), `nonzero`,
    `masked_select`, `unique*`, `index` / `index_put` with a boolean mask (its output size
    depends on the mask's contents), and `repeat_interleave` with tensor repeats and no
    `output_size` (the same reason)."""
    name = func._schema.name.split("::")[-1]
    if name in _ALWAYS_READS:
        return name
    if name in _INDEX_OPS:
        indices = kwargs.get("indices", args[1] if len(args) > 1 else None)
        return f"{name} (boolean mask)" if _has_bool_index(indices) else None
    if name == "repeat_interleave":
        repeats = kwargs.get("repeats", args[1] if len(args) > 1 and func._overloadname != "Tensor" else args[0])
        output_size = kwargs.get("output_size")
        if torch.is_tensor(repeats) and output_size is None:
            return "repeat_interleave (no output_size)"
    return None


class OpCounter(TorchDispatchMode):
    """Counts aten ops and host reads in the current section: "step" (the trainer's own
    code), "render" (only host reads, when asked) or None (paused)."""

    def __init__(self, count_render_reads: bool = False):
        super().__init__()
        self.count_render_reads = count_render_reads
        self.section: Optional[str] = None
        self.reset()

    def reset(self) -> None:
        self.ops = 0
        self.twin_ops = 0  # of self.ops, those inside a dispatched op's torch twin
        self.twin_calls = 0
        self.reads: Counter = Counter()
        self.render_reads: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.section == "step":
            self.ops += 1
            read = host_read_name(func, args, kwargs)
            if read:
                self.reads[read] += 1
        elif self.section == "render" and self.count_render_reads:
            read = host_read_name(func, args, kwargs)
            if read:
                self.render_reads[read] += 1
        return func(*args, **kwargs)

    @contextmanager
    def in_section(self, section: Optional[str]) -> Iterator[None]:
        before, self.section = self.section, section
        try:
            yield
        finally:
            self.section = before

    @property
    def cuda_estimate_ops(self) -> int:
        """The ops, each twin call counted as one kernel launch (see the module's docstring)."""
        return self.ops - self.twin_ops + self.twin_calls


@contextmanager
def twins_counted_as_kernels(counter: OpCounter) -> Iterator[None]:
    """While open, the torch twins of the dispatched ops tell `counter` their calls and ops."""
    from turbogs.kernels import turbo_cpu, turbo_torch

    def counted(fn):
        def call(*args, **kwargs):
            if counter.section != "step":
                return fn(*args, **kwargs)
            before = counter.ops
            try:
                return fn(*args, **kwargs)
            finally:
                counter.twin_ops += counter.ops - before
                counter.twin_calls += 1
        return call

    # The twins, and the CPU's native tile loss (turbo_cpu's other ops call the twins).
    targets = [(turbo_torch, name) for name in TWIN_OPS] + [(turbo_cpu, "tile_loss")]
    originals = [(module, name, getattr(module, name)) for module, name in targets]
    for module, name, fn in originals:
        setattr(module, name, counted(fn))
    try:
        yield
    finally:
        for module, name, fn in originals:
            setattr(module, name, fn)


class AuditObserver(StepObserver):
    """The trainer's seam, wired to an OpCounter: render and backward are not the trainer's code."""

    def __init__(self, counter: OpCounter):
        self.counter = counter
        self.density_stats: Optional[dict] = None

    def render(self):
        return self.counter.in_section("render")

    def backward(self):
        return self.counter.in_section(None)

    def density(self, stats: dict) -> None:
        self.density_stats = stats


def summarize(steps: List[dict]) -> Optional[dict]:
    """{host_reads_per_step: {median, max, by_op}, ops_per_step: {median, max}, steps} of these steps."""
    if not steps:
        return None
    reads = [sum(s["reads"].values()) for s in steps]
    ops = [s["ops"] for s in steps]
    estimate = [s.get("cuda_estimate_ops", s["ops"]) for s in steps]
    by_op: Counter = Counter()
    for s in steps:
        by_op.update(s["reads"])
    return {
        "steps": len(steps),
        "host_reads_per_step": {"median": statistics.median(reads), "max": max(reads),
                                "by_op": {k: round(v / len(steps), 3) for k, v in sorted(by_op.items())}},
        "ops_per_step": {"median": statistics.median(ops), "max": max(ops)},
        "ops_per_step_cuda_estimate": {"median": statistics.median(estimate), "max": max(estimate)},
    }


def audit_preset(name: str, scene, settings: BenchSettings, steps: int,
                 density_steps_wanted: int = DENSITY_STEPS_WANTED) -> dict:
    """Train preset `name` under the audit; its entry of step_audit.json."""
    cfg = base_config(name, settings).for_run(steps=max(steps, SCHEDULE_STEPS))
    trainer = make_trainer(scene, cfg, settings)
    counter = OpCounter(count_render_reads=settings.device.type == "cuda")
    observer = AuditObserver(counter)
    trainer.observer = observer
    ordinary: List[dict] = []
    density: List[dict] = []
    render_reads: Counter = Counter()
    with counter, twins_counted_as_kernels(counter):
        while trainer.step < cfg.steps and (len(ordinary) + len(density) < steps or len(density) < density_steps_wanted):
            counter.reset()
            observer.density_stats = None
            batched_before = host_read.reads_so_far()
            with counter.in_section("step"):
                trainer.timed_step()
            record = {"ops": counter.ops, "cuda_estimate_ops": counter.cuda_estimate_ops, "reads": dict(counter.reads)}
            if host_read.reads_so_far() > batched_before:  # .tolist() runs no op on the CPU: counted apart
                record["reads"][BATCHED_READ] = host_read.reads_so_far() - batched_before
            render_reads.update(counter.render_reads)
            is_density = bool(observer.density_stats and observer.density_stats.get("densified"))
            (density if is_density else ordinary).append(record)
    counted = len(ordinary) + len(density)
    entry = {"steps_counted": counted, "schedule_steps": cfg.steps, "num_gaussians": len(trainer.gaussians),
             **(summarize(ordinary) or {}),
             "density_control_steps": summarize(density)}
    if counter.count_render_reads:
        entry["render_host_reads"] = {"per_step": round(sum(render_reads.values()) / max(counted, 1), 3),
                                      "by_op": dict(sorted(render_reads.items()))}
    return entry


def run_step_audit(settings: BenchSettings, steps: Optional[int] = None) -> dict:
    """Audit every preset in turn; writes DIR/step_audit.json and returns its content."""
    steps = steps or AUDIT_STEPS
    check_output_dir(settings.out_dir)
    scene = load_bench_scene(settings)
    presets: Dict[str, dict] = {}
    for name in settings.presets:
        settings.log(f"step audit: {name}, {steps} steps or more ...")
        presets[name] = audit_preset(name, scene, settings, steps)
        p = presets[name]
        d = p["density_control_steps"]
        settings.log(f"  {name}: host reads per step median {p['host_reads_per_step']['median']} "
                     f"(max {p['host_reads_per_step']['max']}), ops median {p['ops_per_step']['median']} "
                     f"(CUDA-path estimate {p['ops_per_step_cuda_estimate']['median']}); "
                     + (f"density-control steps: reads median {d['host_reads_per_step']['median']}, ops median "
                        f"{d['ops_per_step']['median']}" if d else "no density-control step"))
    result = {
        "scope": SCOPE,
        "cuda_estimate": CUDA_ESTIMATE_NOTE,
        "scene": str(settings.scene),
        "device": str(settings.device),
        "machine": machine_info(settings.device),
        "command": settings.command,
        "settings": list(settings.config_settings),
        "host_read_ops": sorted(_ALWAYS_READS) + ["index/index_put with a boolean mask",
                                                 "repeat_interleave without output_size", BATCHED_READ],
        "presets": presets,
    }
    atomic_write_json(settings.out_dir / "step_audit.json", result)
    settings.log(f"wrote {settings.out_dir / 'step_audit.json'}")
    return result
