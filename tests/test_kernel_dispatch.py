"""The dispatch point is loud on CUDA: a kernel that cannot be built is one clear error, the
twins run there only when asked for, and every result says which backend produced it.

No GPU is needed: the CUDA modules' loaders are replaced by failing stand-ins.
"""

import json
import subprocess
import sys
import types

import pytest
import torch
from test_cli import DEMO, small_demo
from test_render import HEIGHT, WIDTH, make_camera, make_gaussians

from turbogs import kernels
from turbogs.data.load import load_scene
from turbogs.errors import TurboGSError
from turbogs.kernels import raster_cpu, raster_gsplat, turbo_cuda, turbo_torch
from turbogs.render import render
from turbogs.tiles import sampled_pixels
from turbogs.training.config import get_preset
from turbogs.training.trainer import SessionOptions, Trainer


@pytest.fixture(autouse=True)
def kernels_as_found():
    """Each test starts and ends with the twins off and no cached CUDA module."""
    kernels.use_torch_twins(False)
    turbo_cuda._module.cache_clear()
    raster_gsplat.require.cache_clear()
    yield
    kernels.use_torch_twins(False)
    turbo_cuda._module.cache_clear()
    raster_gsplat.require.cache_clear()


def failing_build(monkeypatch, message="nvcc fatal : Unsupported gpu architecture 'compute_90'\nmore lines"):
    def build():
        raise RuntimeError(message)

    monkeypatch.setattr(turbo_cuda, "_module", build)


def test_backend_names():
    native = raster_cpu.load(log=lambda message: None)  # the CPU's compositing: native when it could be built
    assert kernels.backend_name(torch.device("cpu")) == ("cpu-native" if native else "torch")
    assert kernels.backend_name(torch.device("cuda")) == "gsplat+turbogs._C"
    kernels.use_torch_twins(True)
    assert kernels.backend_name(torch.device("cuda")) == "gsplat+twins"
    assert kernels.backend_name(torch.device("cpu")) == "torch"


def test_a_failed_kernel_build_on_cuda_is_one_clear_error(monkeypatch):
    failing_build(monkeypatch)
    with pytest.raises(TurboGSError) as caught:
        kernels._turbo_backend(True)
    message = str(caught.value)
    assert "\n" not in message
    assert "(turbogs._C) could not be built or loaded: nvcc fatal" in message and "--torch-twins" in message
    # The trainer's check before its first step (gsplat's half stubbed: importing the real
    # one here would start gsplat's own compile on any machine with nvcc).
    monkeypatch.setattr(raster_gsplat, "require", lambda: None)
    with pytest.raises(TurboGSError, match="could not be built or loaded"):
        kernels.require_cuda_kernels()
    kernels.use_torch_twins(True)
    kernels.require_cuda_kernels()  # the twins asked for: nothing to build, no error


def test_the_twins_run_on_cuda_only_when_asked_for(monkeypatch):
    failing_build(monkeypatch)
    assert kernels._turbo_backend(False) is turbo_torch  # not CUDA float32 inputs: the twins
    kernels.use_torch_twins(True)
    assert kernels._turbo_backend(True) is turbo_torch  # no build attempted, no error
    kernels.use_torch_twins(False)
    with pytest.raises(TurboGSError):
        kernels._turbo_backend(True)


def test_a_missing_gsplat_build_is_one_clear_error(monkeypatch):
    """gsplat itself only warns and leaves its extension None when it cannot build."""
    monkeypatch.setitem(sys.modules, "gsplat.cuda._backend", types.SimpleNamespace(_C=None))
    with pytest.raises(TurboGSError, match="gsplat's CUDA kernels are missing"):
        kernels._raster_backend(True)
    with pytest.raises(TurboGSError, match="gsplat's CUDA kernels are missing"):
        kernels.require_cuda_kernels()
    assert kernels._raster_backend(False, torch.float16) is kernels.raster_torch  # the CPU never asks gsplat


def test_alpha_is_zero_outside_the_rendered_tiles():
    mask = torch.tensor([[True, False, True], [False, True, False]])
    out = render(make_gaussians(60, 2), make_camera(), tile_mask=mask)
    outside = ~sampled_pixels(mask, WIDTH, HEIGHT)
    assert float(out.alpha.detach()[outside].abs().max()) == 0.0
    assert float(out.alpha.detach()[~outside].max()) > 0.1  # and something was drawn inside


@pytest.mark.parametrize("preset", ["turbo", "3dgs"])
def test_warm_up_changes_nothing(tmp_path, preset):
    """The untimed warm-up before the clock (run on CUDA) leaves every state as it found it."""
    scene = load_scene(small_demo(tmp_path / "scene", views=6), eval_split=True, log=lambda *_: None)
    trainer = Trainer(scene, get_preset(preset).for_run(steps=10), SessionOptions(out_dir=tmp_path / "out", progress=False))
    before = {k: v.detach().clone() for k, v in trainer.gaussians.params.items()}
    generator, rng = trainer.generator.get_state(), torch.get_rng_state()
    memory = None if trainer.memory is None else trainer.memory.errors.clone()
    trainer.warm_up()
    for name, value in trainer.gaussians.params.items():
        assert torch.equal(value.detach(), before[name]) and value.grad is None, name
    assert all(not o.state for o in trainer.optimizers.values())
    assert torch.equal(trainer.generator.get_state(), generator) and torch.equal(torch.get_rng_state(), rng)
    assert memory is None or torch.equal(trainer.memory.errors, memory)
    assert trainer.step == 0 and trainer.elapsed == 0.0


@pytest.mark.parametrize("twins", [False, True])
def test_results_json_records_the_backend(tmp_path, twins):
    out = tmp_path / "model"
    result = subprocess.run(
        [sys.executable, "-m", "turbogs", "train", str(DEMO), "--steps", "3", "--eval", "--quiet", "--out", str(out)]
        + (["--torch-twins"] if twins else []),
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    native = not twins and raster_cpu.load(log=lambda message: None)
    assert json.loads((out / "results.json").read_text())["backend"] == ("cpu-native" if native else "torch")
