"""The read-free pieces of a training step: each equals a straightforward version that reads
from the device, and reads nothing under the step audit's counter."""

import time

import pytest
import torch

from turbogs.bench.audit import OpCounter
from turbogs.optim.curvature import calibration_quantile
from turbogs.tiles import TILE_SIZE, sampled_pixel_values, sampled_pixels, tile_grid
from turbogs.training.clock import StepClock


def counted(fn, *args, **kwargs):
    """fn's result and the host reads it made."""
    counter = OpCounter()
    with counter, counter.in_section("step"):
        result = fn(*args, **kwargs)
    return result, dict(counter.reads)


def random_tiles(height, width, generator):
    rows, cols = tile_grid(height, width)
    mask = torch.rand(rows, cols, generator=generator) < 0.4
    mask.view(-1)[0] = True
    return torch.nonzero(mask.view(-1)).squeeze(1), mask


def test_sampled_pixel_values_equal_the_boolean_gather_without_a_read():
    generator = torch.Generator().manual_seed(0)
    for height, width in ((96, 128), (33, 40), (82, 125), (16, 16)):
        tile_ids, tile_mask = random_tiles(height, width, generator)
        image = torch.rand(height, width, 3, generator=generator, requires_grad=True)
        inside = sampled_pixels(tile_mask, width, height)
        expected = image[inside]
        got, reads = counted(sampled_pixel_values, image, tile_ids)
        assert not reads, reads
        assert got.shape == (len(tile_ids) * TILE_SIZE * TILE_SIZE, 3)
        count = expected.shape[0]  # the real pixels come first, in row-major order; then zeros
        assert torch.equal(got[:count], expected) and not got[count:].any()
        if height % TILE_SIZE == 0 and width % TILE_SIZE == 0:
            assert torch.equal(got, expected)
        # the same gradient: the padding passes none back
        weights = torch.rand(got.shape, generator=generator)
        (grad_got,) = torch.autograd.grad((got * weights).sum(), image)
        (grad_expected,) = torch.autograd.grad((expected * weights[:count]).sum(), image)
        assert torch.equal(grad_got, grad_expected)
    image = torch.rand(5, 7, 3)
    assert torch.equal(sampled_pixel_values(image, None), image[torch.ones(5, 7, dtype=torch.bool)])


def boolean_quantile(adam, curvature, q):
    """The calibration as it was: a boolean selection (one read for its size), then torch.quantile."""
    ratio = (adam / curvature)[(curvature > 0) & (adam > 0)]
    if ratio.numel() == 0:
        return torch.zeros((), dtype=torch.float64)
    return torch.quantile(ratio, q).double()


def test_calibration_quantile_equals_the_boolean_selection_without_a_read():
    generator = torch.Generator().manual_seed(1)
    for trial in range(100):
        rows = int(torch.randint(1, 400, (1,), generator=generator))
        shape = (rows, 1 + trial % 3)
        adam = torch.rand(shape, generator=generator) * (torch.rand(shape, generator=generator) > 0.3)
        density = float(torch.rand(1, generator=generator))
        curvature = torch.rand(shape, generator=generator) ** 3 * (torch.rand(shape, generator=generator) < density)
        for q in (0.5, 0.1, 0.93):
            got, reads = counted(calibration_quantile, adam, curvature, q)
            assert not reads, reads
            assert torch.equal(got, boolean_quantile(adam, curvature, q)), (trial, q)
    assert calibration_quantile(torch.zeros(4, 3), torch.ones(4, 3), 0.5) == 0


def test_hybrid_curvature_update_reads_nothing():
    """update_hessian with calibration (the turbo preset's means) makes no host read."""
    from turbogs.optim.hybrid import HybridOptimizer

    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.randn(40, 3))
    optimizer = HybridOptimizer([param], lr=0.01, max_lengthening=2.0, calibration_quantile=0.5)
    for _ in range(3):
        param.grad = torch.randn_like(param)
        optimizer.step(ok=torch.tensor(True))
        _, reads = counted(optimizer.update_hessian, torch.rand_like(param), visible=torch.rand(40) > 0.3,
                           ok=torch.tensor(True))
        assert not reads, reads
    assert optimizer.state[param]["kappa"] > 0


class FakeEvent:
    """A stand-in for torch.cuda.Event on the CPU: its GPU time runs `lag` seconds per record
    behind the host's, and it counts the waits."""

    records, waits, lag = 0, 0, 0.25

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self):
        FakeEvent.records += 1
        self.at = time.perf_counter() + FakeEvent.lag * FakeEvent.records

    def synchronize(self):
        FakeEvent.waits += 1

    def elapsed_time(self, end):
        return (end.at - self.at) * 1000.0


def test_step_clock_uses_events_with_one_wait_per_read():
    FakeEvent.records = FakeEvent.waits = 0
    clock = StepClock(torch.device("cuda"), events=FakeEvent)
    host, started = [], time.perf_counter()
    for _ in range(5):
        clock.start()
        time.sleep(0.001)
        host.append(clock.stop())
    assert FakeEvent.waits == 0  # no wait per step
    first_at = time.perf_counter()
    correction = clock.settle()
    assert FakeEvent.waits == 1
    # GPU time of the stretch: from the first step's start event to the last step's end event,
    # which the fake puts 5 records of lag later (6 records: one start, five ends re-recorded)
    measured = sum(host) + correction
    assert 5 * FakeEvent.lag < measured < 5 * FakeEvent.lag + (first_at - started)
    assert clock.settle() == 0.0  # nothing since
    cpu = StepClock(torch.device("cpu"))
    cpu.start()
    time.sleep(0.002)
    assert cpu.stop() >= 0.002 and cpu.settle() == 0.0


def test_trainer_clock_settles_at_the_figures_read(tmp_path, monkeypatch):
    """timed_step never waits for the device; read_device_figures adds the events' correction."""
    from test_cli import small_demo

    from turbogs.bench.race import BenchSettings, make_trainer, preset_config
    from turbogs.data.load import load_scene
    from turbogs.training import trainer as train

    scene = load_scene(small_demo(tmp_path / "scene", views=3), eval_split=False, log=lambda *_: None)
    settings = BenchSettings(scene=tmp_path / "scene", presets=["3dgs"], out_dir=tmp_path / "out", log=lambda *_: None)
    trainer = make_trainer(scene, preset_config("3dgs", settings), settings)
    monkeypatch.setattr(train, "synchronize", lambda device: pytest.fail("timed_step waited for the device"))
    FakeEvent.records = FakeEvent.waits = 0
    trainer.clock = StepClock(torch.device("cuda"), events=FakeEvent)
    for _ in range(3):
        trainer.timed_step()
    estimated = trainer.elapsed
    assert FakeEvent.waits == 0 and estimated > 0
    trainer.read_device_figures()
    assert FakeEvent.waits == 1
    assert trainer.elapsed > estimated + 2 * FakeEvent.lag  # the events' (lagging) time, not the host's


def test_sampled_pixels_kept_for_the_same_mask_and_recomputed_for_another():
    """The answer is kept for the last mask (a step asks three times), never reused for a
    changed or different mask."""

    def expected(mask, width, height):
        rows, cols = torch.meshgrid(torch.arange(height) // TILE_SIZE, torch.arange(width) // TILE_SIZE, indexing="ij")
        return mask[rows, cols]

    mask = torch.tensor([[True, False, True], [False, True, False]])
    first = sampled_pixels(mask, 40, 20)
    assert torch.equal(first, expected(mask, 40, 20))
    counter = OpCounter()
    with counter, counter.in_section("step"):
        again = sampled_pixels(mask, 40, 20)
    assert again is first and counter.ops == 0
    mask[0, 1] = True  # changed in place: recomputed
    assert torch.equal(sampled_pixels(mask, 40, 20), expected(mask, 40, 20))
    other = ~mask
    assert torch.equal(sampled_pixels(other, 40, 20), expected(other, 40, 20))
    assert torch.equal(sampled_pixels(other, 36, 17), expected(other, 36, 17))
    for _ in range(20):  # fresh masks (some at a freed one's address) are never mistaken for it
        fresh = torch.rand(2, 3) < 0.5
        assert torch.equal(sampled_pixels(fresh, 40, 20), expected(fresh, 40, 20))
        del fresh


def test_ssim_with_cached_blur_weights_is_bit_identical():
    """metrics.ssim_map, with its blur weights made once and the five moments blurred as one
    stack, gives the same bits as five blurs building their weights each time (the code
    before), so the evaluation and the 3dgs loss are unchanged."""
    import torch.nn.functional as F

    from turbogs import metrics

    def reference(img, gt):
        x, y = img[None].permute(0, 3, 1, 2), gt[None].permute(0, 3, 1, 2)
        kernel = metrics.gaussian_kernel_1d().to(x.dtype)
        size = kernel.numel()

        def blur(t):
            vertical = kernel.view(1, 1, size, 1).expand(3, 1, size, 1)
            horizontal = kernel.view(1, 1, 1, size).expand(3, 1, 1, size)
            t = F.conv2d(t, vertical, padding=(size // 2, 0), groups=3)
            return F.conv2d(t, horizontal, padding=(0, size // 2), groups=3)

        mu_x, mu_y = blur(x), blur(y)
        var_x, var_y, cov = blur(x * x) - mu_x**2, blur(y * y) - mu_y**2, blur(x * y) - mu_x * mu_y
        ssim = ((2 * mu_x * mu_y + metrics.SSIM_C1) * (2 * cov + metrics.SSIM_C2)
                / ((mu_x**2 + mu_y**2 + metrics.SSIM_C1) * (var_x + var_y + metrics.SSIM_C2)))
        return ssim.permute(0, 2, 3, 1)[0]

    generator = torch.Generator().manual_seed(2)
    for shape in ((40, 50, 3), (17, 23, 3)):
        img, gt = torch.rand(shape, generator=generator), torch.rand(shape, generator=generator)
        assert torch.equal(metrics.ssim_map(img, gt), reference(img, gt))
