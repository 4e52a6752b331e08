"""The native CPU rasterizer (cuda/cpu/rasterize_cpu.cpp) against its twin, the oracle.

Random screen-space scenes, built to hold every case the rules have: empty tiles (a band
with no Gaussian), masked tiles, Gaussians that straddle tiles, a pile of near-opaque ones
whose pixels stop at the transmittance cut-off, isolated faint ones whose footprint ends at
the alpha threshold, clamped alphas, extra feature channels and a background. Forward
within 1e-5, gradients within 1e-4 of the largest (float32), far closer in float64; the
same bits on 1 and 2 threads; and the dispatch picks it when it is built.
Skipped, with the reason, only where it cannot be built (no C++ compiler).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from turbogs import kernels
from turbogs.kernels import raster_cpu, raster_torch
from turbogs.tiles import TILE_SIZE, tile_grid

WIDTH, HEIGHT = 90, 70  # 6 x 5 tiles, the last column and row partial


@pytest.fixture(scope="module", autouse=True)
def native():
    """Skipped where there is no C++ compiler; with one, a failed build is a failure."""
    lines = []
    if not raster_cpu.load(log=lines.append):
        if not any(shutil.which(name) for name in ("c++", "g++", "clang++")):
            pytest.skip("no C++ compiler here: TurboGS's CPU kernels cannot be built")
        pytest.fail(f"TurboGS's CPU kernels failed to build with a compiler present: {lines}")


@pytest.fixture(autouse=True)
def twins_off():
    kernels.use_torch_twins(False)
    yield
    kernels.use_torch_twins(False)


def make_scene(n: int, seed: int, channels: int = 5, dtype=torch.float32):
    """(means2d, conics, colors, opacities, radii, depths) of n random splats on screen.

    The column of tiles at x 64..80 holds no Gaussian but one faint splat in its fourth tile.
    The first 6 form a pile of near-opaque splats on pixel (20, 20): three of alpha 0.98 take the
    transmittance to 8e-6, past the cut-off. The next 4 are faint, isolated and small.
    """
    g = torch.Generator().manual_seed(seed)
    # x in [-6, 40) or [100, 110), and a footprint reaches at most 3.33 sigma <= 20 px: the
    # column of tiles at 64..80 stays empty.
    x = torch.rand(n, generator=g) * 56 - 6
    x = torch.where(x > 40, x + 60, x)
    y = torch.rand(n, generator=g) * (HEIGHT + 12) - 6
    sigma = torch.exp(torch.rand(n, 2, generator=g) * math.log(10.0)) * 0.6  # 0.6 .. 6 px
    opacities = torch.rand(n, generator=g) * 0.95 + 0.02
    x[:6], y[:6], sigma[:6], opacities[:6] = 20.5, 20.5, 4.0, 0.98  # on the center of pixel (20, 20)
    x[6:10] = torch.tensor([72.0, 45.0, 8.0, 40.0])  # the first alone in its tile (64..80, 48..64)
    y[6:10] = torch.tensor([56.0, 60.0, 62.0, 8.0])
    sigma[6:10], opacities[6:10] = 1.5, 0.05
    angle = torch.rand(n, generator=g) * math.pi
    cos, sin = torch.cos(angle), torch.sin(angle)
    sx2, sy2 = sigma[:, 0] ** 2, sigma[:, 1] ** 2
    cov_xx = cos * cos * sx2 + sin * sin * sy2
    cov_yy = sin * sin * sx2 + cos * cos * sy2
    cov_xy = cos * sin * (sx2 - sy2)
    det = cov_xx * cov_yy - cov_xy * cov_xy
    conics = torch.stack([cov_yy / det, -cov_xy / det, cov_xx / det], dim=-1)
    radii = torch.ceil(raster_torch.RADIUS_EXTENT * torch.stack([cov_xx, cov_yy], -1).sqrt()).int()
    depths = torch.rand(n, generator=g) * 5 + 1
    depths[:6] = torch.arange(6) * 0.01 + 0.1  # the pile in front
    colors = torch.rand(n, channels, generator=g)
    colors[:, 3:] = torch.randn(n, channels - 3, generator=g)  # feature channels: any sign
    means2d = torch.stack([x, y], dim=-1)
    return [t.to(dtype) for t in (means2d, conics, colors, opacities)] + [radii, depths]


def render_with(backend, scene, tile_mask=None, background=None):
    """Image, alpha and the gradients of a random linear function of both."""
    means2d, conics, colors, opacities, radii, depths = scene
    th, tw = tile_grid(HEIGHT, WIDTH)
    offsets, ids = raster_torch.intersect_tiles(means2d, radii, depths, TILE_SIZE, tw, th, tile_mask)
    leaves = [t.detach().clone().requires_grad_() for t in (means2d, conics, colors, opacities)]
    bg = None if background is None else background.detach().clone().requires_grad_()
    image, alpha = backend.rasterize(*leaves, WIDTH, HEIGHT, TILE_SIZE, offsets, ids, bg, tile_mask)
    g = torch.Generator().manual_seed(7)
    weights = torch.randn(image.shape, generator=g, dtype=image.dtype)
    alpha_weights = torch.randn(alpha.shape, generator=g, dtype=alpha.dtype)
    ((image * weights).sum() + (alpha * alpha_weights).sum()).backward()
    grads = [t.grad for t in leaves] + ([] if bg is None else [bg.grad])
    return image.detach(), alpha.detach(), grads


def assert_agree(native, twin, forward_tol, grad_tol):
    image, alpha, grads = native
    image_t, alpha_t, grads_t = twin
    assert (image - image_t).abs().max() <= forward_tol
    assert (alpha - alpha_t).abs().max() <= forward_tol
    names = ["means2d", "conics", "colors", "opacities", "background"]
    for name, got, want in zip(names, grads, grads_t):
        scale = want.abs().max()
        assert scale > 0, name
        error = float((got - want).abs().max() / scale)
        assert error <= grad_tol, f"{name}: {error:.2e} of the largest gradient"


CASES = {
    "every tile": dict(mask=None, background=None),
    "every tile, background": dict(mask="none", background=True),
    "masked tiles, background": dict(mask="half", background=True),
}


def tile_mask_for(kind, seed):
    th, tw = tile_grid(HEIGHT, WIDTH)
    if kind in (None, "none"):
        return None
    mask = torch.rand(th, tw, generator=torch.Generator().manual_seed(seed)) < 0.5
    mask[1, 1] = mask[3, 4] = True  # the pile's tile, the faint splat's
    mask[0, 0] = False
    return mask


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_native_matches_the_twin(case, seed):
    scene = make_scene(300, seed)
    mask = tile_mask_for(CASES[case]["mask"], seed)
    background = torch.tensor([0.2, 0.5, 0.9, 0.0, 0.0]) if CASES[case]["background"] else None
    native = render_with(raster_cpu, scene, mask, background)
    twin = render_with(raster_torch, scene, mask, background)
    assert_agree(native, twin, 1e-5, 1e-4)

    image, alpha, _ = native
    # The scene holds what it is meant to: an empty column of tiles, the cut-off, faint edges.
    rendered = torch.ones(HEIGHT, WIDTH, 1) if mask is None else (
        mask.repeat_interleave(TILE_SIZE, 0).repeat_interleave(TILE_SIZE, 1)[:HEIGHT, :WIDTH, None].float())
    empty = rendered * (torch.zeros(5) if background is None else background)  # background where rendered, else 0
    assert float(alpha[:48, 64:80].abs().max()) == 0.0 and torch.equal(image[:48, 64:80], empty[:48, 64:80])
    pile = float(alpha[20, 20, 0])
    assert 1 - 1e-3 < pile < 1 - 2e-4, pile  # two of the pile composited, the third cut off (1 - 8e-6)
    faint = alpha[48:64, 64:80, 0]  # the faint splat's tile: zero beyond its threshold ellipse
    assert float(faint.min()) == 0.0 and 1 / 255 - 1e-7 <= float(faint[faint > 0].min()) < 2 / 255
    if mask is not None:
        outside = ~mask.repeat_interleave(TILE_SIZE, 0).repeat_interleave(TILE_SIZE, 1)[:HEIGHT, :WIDTH]
        assert float(image[outside].abs().max()) == 0.0 and float(alpha[outside].abs().max()) == 0.0
        assert float(native[2][0][: 6].abs().sum()) > 0  # the pile's tile is rendered: it has gradients


@pytest.mark.parametrize("channels", [3, 6])
def test_any_channel_count_and_odd_splats_match_the_twin(channels):
    """RGB alone and a count the kernels read at run time (4 and 5 are covered above); with
    conics that are not positive definite (they may cover a whole tile: the twin keeps them
    where -sigma <= 0), a zero opacity and one below the alpha threshold."""
    means2d, conics, colors, opacities, radii, depths = make_scene(250, 4, channels=channels)
    conics[10:13, 1] = conics[10:13, 0] * 2 + conics[10:13, 2]  # b^2 > a c: indefinite
    conics[13, 0] = -conics[13, 0]  # negative definite
    opacities[14], opacities[15] = 0.0, 0.5 / 255
    scene = [means2d, conics, colors, opacities, radii, depths]
    background = torch.linspace(0.1, 0.9, channels)
    for mask in (None, tile_mask_for("half", 4)):
        native = render_with(raster_cpu, scene, mask, background)
        assert_agree(native, render_with(raster_torch, scene, mask, background), 1e-5, 1e-4)


def test_float64_matches_the_twin_closely():
    scene = make_scene(120, 3, dtype=torch.float64)
    background = torch.tensor([0.3, 0.1, 0.7, 0.0, 0.0], dtype=torch.float64)
    mask = tile_mask_for("half", 3)
    native = render_with(raster_cpu, scene, mask, background)
    twin = render_with(raster_torch, scene, mask, background)
    assert native[0].dtype == torch.float64
    assert_agree(native, twin, 1e-12, 1e-10)


def test_gradients_against_finite_differences_in_float64():
    """A tiny scene, the kernel's backward against central differences of its own forward."""
    means2d, conics, colors, opacities, radii, depths = make_scene(12, 5, channels=4, dtype=torch.float64)
    th, tw = tile_grid(HEIGHT, WIDTH)
    offsets, ids = raster_torch.intersect_tiles(means2d, radii, depths, TILE_SIZE, tw, th)
    background = torch.tensor([0.3, 0.1, 0.7, 0.0], dtype=torch.float64, requires_grad=True)
    inputs = [t.clone().requires_grad_() for t in (means2d, conics, colors, opacities)]
    # Small opacities keep every alpha off the clamp and the cut-off, where the output is smooth.
    with torch.no_grad():
        inputs[3].mul_(0.3)

    def fn(m, q, c, o, bg):
        image, alpha = raster_cpu.rasterize(m, q, c, o, WIDTH, HEIGHT, TILE_SIZE, offsets, ids, bg)
        return image.sum(dim=(0, 1)), alpha.sum()

    assert torch.autograd.gradcheck(fn, (*inputs, background), eps=1e-6, atol=1e-5, rtol=1e-4)


def test_results_do_not_depend_on_the_thread_count():
    scene = make_scene(400, 11)
    mask = tile_mask_for("half", 11)
    background = torch.tensor([0.2, 0.5, 0.9, 0.0, 0.0])
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(render_with(raster_cpu, scene, mask, background))
    finally:
        torch.set_num_threads(before)
    (image1, alpha1, grads1), (image2, alpha2, grads2) = runs
    assert torch.equal(image1, image2) and torch.equal(alpha1, alpha2)
    for g1, g2 in zip(grads1, grads2):
        assert torch.equal(g1, g2)


COPY_SCRIPT = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from test_raster_cpu import make_scene, render_with, tile_mask_for
from turbogs.kernels import raster_cpu
scene = make_scene(400, 12)
image, alpha, grads = render_with(raster_cpu, scene, tile_mask_for("half", 12), torch.tensor([0.2, 0.5, 0.9, 0.0, 0.0]))
torch.save([image, alpha] + grads, sys.argv[2])
"""


def test_every_copy_of_the_kernels_gives_the_same_bits(tmp_path):
    """The baseline, AVX2 and AVX-512 copies (one source, -ffp-contract=off) round alike, lane
    for lane: a model trains to the same bits on any x86 CPU. $TURBOGS_CPU_KERNELS picks the
    copy once per process (a copy the CPU lacks falls back to the widest it has)."""
    runs = []
    for copy in ("base", "avx2", "avx512"):
        out = tmp_path / f"{copy}.pt"
        env = dict(os.environ, TURBOGS_CPU_KERNELS=copy)
        subprocess.run([sys.executable, "-c", COPY_SCRIPT, str(Path(__file__).parent), str(out)], env=env, check=True)
        runs.append(torch.load(out))
    for other in runs[1:]:
        for got, want in zip(other, runs[0]):
            assert torch.equal(got, want)


def sh_inputs(count, dtype, seed=0):
    """Directions of every scale (one zero, one below F.normalize's floor) and 16 coefficients."""
    g = torch.Generator().manual_seed(seed)
    dirs = torch.randn(count, 3, generator=g, dtype=dtype) * torch.logspace(-3, 3, count, dtype=dtype)[:, None]
    dirs[0], dirs[1] = 0.0, 1e-14
    return dirs, torch.randn(count, 16, 3, generator=g, dtype=dtype)


def sh_with(backend, degree, dirs, coeffs):
    """Value and both gradients (a missing one as zeros) of a random linear function of it."""
    dirs, coeffs = dirs.clone().requires_grad_(), coeffs.clone().requires_grad_()
    value = backend.spherical_harmonics(degree, dirs, coeffs)
    (value * torch.randn(value.shape, generator=torch.Generator().manual_seed(5), dtype=value.dtype)).sum().backward()
    return [value.detach(), torch.zeros_like(dirs) if dirs.grad is None else dirs.grad, coeffs.grad]


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.float64, 1e-13)])
def test_native_spherical_harmonics_match_the_twin(dtype, tol):
    dirs, coeffs = sh_inputs(400, dtype)
    for degree in range(4):
        native, twin = sh_with(raster_cpu, degree, dirs, coeffs), sh_with(raster_torch, degree, dirs, coeffs)
        # Normal directions and the two clamped ones apart: the latter's gradients are 1e12 times larger.
        for rows in (slice(2, None), slice(0, 2)):
            for name, got, want in zip(("value", "dirs", "coeffs"), native, twin):
                scale = float(want[rows].abs().max())
                error = float((got[rows] - want[rows]).abs().max())
                assert error <= tol * max(scale, 1e-30), f"degree {degree} {name}: {error:.2e} of {scale:.2e}"
        assert not native[2][:, (degree + 1) ** 2:].any()  # unused coefficients: no gradient


def test_masked_spherical_harmonics_match_the_twin_and_leave_masked_rows_alone():
    """gsplat's `masks`: masked-out rows are 0 and get no gradient, on both, and the other rows
    are what the unmasked op gives (the renderer masks what the projection culled)."""
    dirs, coeffs = sh_inputs(300, torch.float64, seed=4)
    keep = torch.rand(300, generator=torch.Generator().manual_seed(1)) < 0.4
    for degree in range(4):
        plain = sh_with(raster_torch, degree, dirs, coeffs)
        for backend in (raster_cpu, raster_torch):
            leaves = dirs.clone().requires_grad_(), coeffs.clone().requires_grad_()
            value = backend.spherical_harmonics(degree, *leaves, keep)
            weights = torch.randn(value.shape, generator=torch.Generator().manual_seed(5), dtype=value.dtype)
            (value * weights).sum().backward()
            dirs_grad = torch.zeros_like(dirs) if leaves[0].grad is None else leaves[0].grad  # degree 0: none
            for got, want in zip((value.detach(), dirs_grad, leaves[1].grad), plain):
                assert not got[~keep].any()
                torch.testing.assert_close(got[keep], want[keep], rtol=1e-12, atol=1e-12)
    inputs = (dirs[2:8].clone().requires_grad_(), coeffs[2:8].clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda d, c: raster_cpu.spherical_harmonics(3, d, c, keep[2:8]), inputs)


def test_the_parts_op_reads_the_stored_coefficients_where_they_lie():
    """spherical_harmonics_parts(sh0, rest) is spherical_harmonics(cat([sh0, rest])) with its
    gradient in both parts (the bands past the degree's get zeros), masked or not, natively and
    as the twin; a gradcheck of both parts."""
    dirs, coeffs = sh_inputs(200, torch.float64, seed=6)
    keep = torch.rand(200, generator=torch.Generator().manual_seed(2)) < 0.5
    weights = torch.randn(200, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    for degree in range(4):
        for masks in (None, keep):
            want_leaf = coeffs.clone().requires_grad_()
            want = raster_torch.spherical_harmonics(degree, dirs, want_leaf[:, : (degree + 1) ** 2], masks)
            (want * weights).sum().backward()
            for backend in (raster_cpu, raster_torch):
                sh0, rest = coeffs[:, :1].clone().requires_grad_(), coeffs[:, 1:].clone().requires_grad_()
                got = backend.spherical_harmonics_parts(degree, dirs, sh0, rest, masks)
                (got * weights).sum().backward()
                torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(torch.cat([sh0.grad, rest.grad], 1), want_leaf.grad, rtol=1e-12, atol=1e-12)
    parts = (dirs[2:8].clone().requires_grad_(), coeffs[2:8, :1].clone().requires_grad_(),
             coeffs[2:8, 1:].clone().requires_grad_())
    assert torch.autograd.gradcheck(lambda d, a, b: raster_cpu.spherical_harmonics_parts(2, d, a, b), parts)


def test_native_spherical_harmonics_gradients_against_finite_differences():
    dirs, coeffs = sh_inputs(6, torch.float64, seed=2)
    inputs = (dirs[2:].clone().requires_grad_(), coeffs[2:].clone().requires_grad_())
    for degree in range(4):
        assert torch.autograd.gradcheck(lambda d, c: raster_cpu.spherical_harmonics(degree, d, c), inputs)


def test_native_spherical_harmonics_leave_degree_4_and_batches_to_the_twin():
    dirs, coeffs = sh_inputs(20, torch.float32)
    coeffs25 = torch.randn(20, 25, 3)
    degree4 = raster_cpu.spherical_harmonics(4, dirs, coeffs25)
    assert torch.equal(degree4, raster_torch.spherical_harmonics(4, dirs, coeffs25))
    batched = raster_cpu.spherical_harmonics(2, dirs[None], coeffs[None])
    assert torch.equal(batched, raster_torch.spherical_harmonics(2, dirs[None], coeffs[None]))
    with pytest.raises(ValueError, match="needs 16 coefficients"):
        raster_cpu.spherical_harmonics(3, dirs, coeffs[:, :9])


def test_the_dispatch_picks_the_native_kernels_unless_the_twins_are_asked_for(monkeypatch):
    calls = []
    for module, name in ((raster_cpu, "native"), (raster_torch, "twin")):
        for op in ("rasterize", "intersect_tiles", "spherical_harmonics"):
            monkeypatch.setattr(module, op, lambda *a, name=name, **k: calls.append(name) or (name, name))

    def every_op():
        kernels.rasterize(torch.zeros(3, 2), *(None,) * 9)
        kernels.intersect_tiles(torch.zeros(3, 2), *(None,) * 5)
        kernels.spherical_harmonics(3, torch.zeros(3, 3), torch.zeros(3, 16, 3))

    every_op()
    assert calls == ["native"] * 3 and kernels.backend_name(torch.device("cpu")) == "cpu-native"
    kernels.use_torch_twins(True)
    every_op()
    assert calls == ["native"] * 3 + ["twin"] * 3 and kernels.backend_name(torch.device("cpu")) == "torch"


def test_without_the_kernels_the_twins_run_and_one_line_says_so(monkeypatch):
    lines = []
    raster_cpu.forget()
    try:
        monkeypatch.setattr(raster_cpu, "build_module", lambda: (_ for _ in ()).throw(
            RuntimeError("Error building extension 'turbogs_cpu'\ng++: not found")))
        assert not raster_cpu.load(log=lines.append)
        assert not raster_cpu.load(log=lines.append)  # tried once per process
        assert len(lines) == 1 and "\n" not in lines[0]
        assert "torch twins run instead" in lines[0] and "install a C++ compiler" in lines[0]
        assert kernels.backend_name(torch.device("cpu")) == "torch"
        assert kernels._raster_backend(False) is raster_torch
    finally:
        raster_cpu.forget()
        raster_cpu.load(log=lambda message: None)


def test_threads_default_to_every_core_and_ranks_share_them(monkeypatch):
    from turbogs import device

    monkeypatch.setattr(device, "available_cores", lambda: 8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert device.cpu_threads() == 8 and device.cpu_threads(3) == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")  # --nproc 3 / torchrun on this machine
    assert device.cpu_threads() == 2 and device.cpu_threads(4) == 1 and device.cpu_threads(2) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # a process's own count, as OpenMP reads it
    assert device.cpu_threads() == 3 and device.cpu_threads(6) == 2
    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        device.pick_device("cpu")
        assert torch.get_num_threads() == 4
        device.pick_device("cpu", 2)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_a_build_says_so_in_one_line_and_a_cached_one_says_nothing(monkeypatch):
    lines = []

    class Build:  # cuda/build.py's two entry points, without compiling anything
        current = False

        def cpu_build_is_current(self):
            return self.current

        def load_cpu_jit(self):
            return "module"

    build = Build()
    monkeypatch.setattr(raster_cpu, "build_module", lambda: build)
    raster_cpu.forget()
    try:
        assert raster_cpu.load(log=lines.append)
        assert lines == ["compiling TurboGS's CPU kernels (once)"]
        raster_cpu.forget()
        build.current = True
        assert raster_cpu.load(log=lines.append) and len(lines) == 1
    finally:
        raster_cpu.forget()
        monkeypatch.undo()
        raster_cpu.load(log=lambda message: None)


def test_the_trainer_builds_the_kernels_before_its_clock_starts(tmp_path, monkeypatch):
    from test_cli import small_demo

    from turbogs.data.load import load_scene
    from turbogs.training.config import get_preset
    from turbogs.training.trainer import SessionOptions, Trainer

    calls = []
    monkeypatch.setattr(raster_cpu, "load", lambda log=None: calls.append(log) or True)
    scene = load_scene(small_demo(tmp_path / "scene", views=4), log=lambda *_: None)
    trainer = Trainer(scene, get_preset("turbo").for_run(steps=5),
                      SessionOptions(out_dir=tmp_path / "out", progress=False, log=lambda message: None))
    assert calls and calls[0] is trainer.log and trainer.elapsed == 0.0 and trainer.step == 0
    kernels.use_torch_twins(True)  # the twins asked for: nothing is built
    calls.clear()
    Trainer(scene, get_preset("turbo").for_run(steps=5),
            SessionOptions(out_dir=tmp_path / "out2", progress=False, log=lambda message: None))
    assert calls == []


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_tile_intersection_is_the_twins_bit_for_bit(seed):
    means2d, conics, colors, opacities, radii, depths = make_scene(400, seed)
    g = torch.Generator().manual_seed(seed)
    radii[torch.rand(400, generator=g) < 0.1] = 0  # culled
    depths[10:40] = depths[50]  # ties in depth: decided by index
    depths[40:45] = -depths[40:45]  # negative depths sort by their bit pattern, as gsplat's do
    th, tw = tile_grid(HEIGHT, WIDTH)
    for mask in (None, tile_mask_for("half", seed)):
        native = raster_cpu.intersect_tiles(means2d, radii, depths, TILE_SIZE, tw, th, mask)
        twin = raster_torch.intersect_tiles(means2d, radii, depths, TILE_SIZE, tw, th, mask)
        assert native[0].dtype == twin[0].dtype == native[1].dtype == twin[1].dtype == torch.int32
        assert torch.equal(native[0], twin[0]) and torch.equal(native[1], twin[1])
        assert native[1].numel() > 100
