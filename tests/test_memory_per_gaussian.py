"""benchmarks/memory_per_gaussian.py (the tables of docs/SCALING.md) against the real objects:
if a parameter, an optimizer's state, a density statistic or the error memory changes size,
or the hybrid optimizer's step allocates differently, these fail and the document is stale."""

from __future__ import annotations

import importlib.util
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from turbogs.density.error_driven import ErrorDensityConfig
from turbogs.density.vanilla import VanillaDensityConfig
from turbogs.gaussians import Gaussians
from turbogs.optim.base import AdamConfig
from turbogs.optim.hybrid import HybridConfig
from turbogs.turbo.sampling import ErrorMemory

_spec = importlib.util.spec_from_file_location(
    "memory_per_gaussian", Path(__file__).resolve().parents[1] / "benchmarks" / "memory_per_gaussian.py")
mem = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mem)

RATES = {"means": 1.6e-4, "scales": 5e-3, "quats": 1e-3, "opacities": 0.05, "sh0": 2.5e-3, "shN": 1.25e-4}


def gaussians(n: int, sh_degree: int) -> Gaussians:
    g = torch.Generator().manual_seed(n)
    return Gaussians.from_points(torch.randn(n, 3, generator=g), torch.rand(n, 3, generator=g), sh_degree)


def stepped_state_bytes(config, n: int, sh_degree: int) -> dict:
    """Bytes of optimizer state per row and in total, after one step with gradients."""
    model = gaussians(n, sh_degree)
    optimizers = config.build(dict(model.params), RATES)
    for param in model.params.values():
        param.grad = torch.full_like(param, 0.1)
    curvature = {name: torch.rand_like(model.params[name]) for name in getattr(config, "curvature_on", ())}
    config.step(optimizers, torch.ones(n, dtype=torch.bool), curvature or None, ok=torch.tensor(True))
    per_row = fixed = 0
    for optimizer in optimizers.values():
        for state in optimizer.state.values():
            for value in state.values():
                size = value.numel() * value.element_size()
                if value.dim() >= 1 and value.shape[0] == n:
                    per_row += size
                else:
                    fixed += size
    return {"per_row": per_row / n, "fixed": fixed}


@pytest.mark.parametrize("sh_degree", [0, 3])
def test_parameters_and_gradients_match_the_gaussians(sh_degree):
    n = 11
    model = gaussians(n, sh_degree)
    words = mem.persistent_words(sh_degree)
    assert sum(p.numel() for p in model.params.values()) == words["parameters"] * n
    assert words["gradients"] == words["parameters"]
    assert model.sh.numel() == mem.render_gaussian_words(sh_degree)["SH coefficients concatenated (Gaussians.sh)"] * n


@pytest.mark.parametrize("sh_degree", [0, 3])
def test_optimizer_state_matches_adam_and_the_hybrid(sh_degree):
    words = mem.persistent_words(sh_degree)
    for config, key in ((AdamConfig(), "Adam state (exp_avg, exp_avg_sq)"),
                        (HybridConfig(), "hybrid state (Adam's, and the curved: hessian, row_step, hessian_count, cache)")):
        small, large = stepped_state_bytes(config, 7, sh_degree), stepped_state_bytes(config, 13, sh_degree)
        assert small["per_row"] == large["per_row"] == words[key] * mem.WORD, type(config).__name__
        assert small["fixed"] == large["fixed"]  # step counters and the like: not per Gaussian


def test_density_statistics_match_both_strategies():
    """The model counts the larger of the two: error-driven's four statistics, vanilla's three."""
    words = mem.persistent_words(3)["density statistics (vanilla 3, error-driven 4)"]
    for config, kept in ((VanillaDensityConfig(), 3), (ErrorDensityConfig(), words)):
        state = config.build().initial_state(17)
        assert sum(v.numel() * v.element_size() for v in state.values()) == kept * mem.WORD * 17


def test_error_memory_matches_its_formula():
    sizes = [(1080, 1920)] * 5
    memory = ErrorMemory(sizes)
    real = memory.errors.numel() * memory.errors.element_size() + memory.tile_counts.numel() * 8
    assert mem.error_memory_bytes(5, 1080, 1920) == real


class _PeakBytes(TorchDispatchMode):
    """Peak bytes of the storages that the ops run under it allocate and keep alive (outputs
    that alias an input, in-place updates and views, allocate nothing)."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.seen = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)}
        for tensor in tree_flatten(out)[0]:
            if not torch.is_tensor(tensor):
                continue
            key = tensor.untyped_storage().data_ptr()
            if key in inputs or key in self.seen or key == 0:
                continue
            self.seen.add(key)
            size = tensor.untyped_storage().nbytes()
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(tensor, self._free, key, size)
        return out

    def _free(self, key, size):
        self.seen.discard(key)
        self.live -= size


def test_hybrid_step_transients_are_six_copies_of_the_curved_parameters():
    n = 4000
    model = gaussians(n, 3)
    config = HybridConfig()
    optimizers = config.build(dict(model.params), RATES)
    ok = torch.tensor(True)
    for _ in range(2):  # the first step also creates the state; measure the second
        for param in model.params.values():
            param.grad = torch.full_like(param, 0.1)
        meter = _PeakBytes()
        with meter:
            config.step(optimizers, torch.ones(n, dtype=torch.bool), None, ok=ok)
    words = mem.optimizer_step_words(3, "hybrid")
    # fused Adam for the uncurved parameters; the curved ones' update and denominator: six copies of them
    assert words * mem.WORD * n <= meter.peak <= (words + 3) * mem.WORD * n + 4096


def test_fused_adam_step_allocates_nothing_per_gaussian():
    n = 4000
    model = gaussians(n, 3)
    config = AdamConfig()
    optimizers = config.build(dict(model.params), RATES)
    for _ in range(2):
        for param in model.params.values():
            param.grad = torch.full_like(param, 0.1)
        meter = _PeakBytes()
        with meter:
            config.step(optimizers, torch.ones(n, dtype=torch.bool), None, ok=torch.tensor(True))
    assert mem.optimizer_step_words(3, "adam") == 0
    assert meter.peak < 4096  # a few scalars, nothing that grows with the Gaussians


def test_report_runs_and_sharding_helps():
    text = mem.report(3, 0.25, 8)
    assert "| parameters | 59 | 236 | 0.236 |" in text
    for opt in ("adam", "hybrid"):
        one = mem.replicated_bytes(3, opt, 0.25, 8)
        per_rank = [mem.sharded_bytes(3, opt, 0.25, 8, ranks) for ranks in (2, 4, 8, 16)]
        assert all(a > b for a, b in zip([one] + per_rank, per_rank))
