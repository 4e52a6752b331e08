import math
import sys
import textwrap

import numpy as np
import pytest
import torch

from turbogs.errors import TurboGSError
from turbogs.metrics import LPIPS, lpips_or_none, lpips_unavailable_reason, psnr, ssim, ssim_map


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These tensors are tiny: on a shared 2-core machine, extra threads only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# --- PSNR -------------------------------------------------------------------------


def test_psnr_constant_offset_is_20_db():
    gt = torch.full((8, 9, 3), 0.4)
    assert psnr(gt + 0.1, gt) == pytest.approx(20.0, abs=1e-5)
    assert psnr(np.full((4, 4, 3), 0.5), np.full((4, 4, 3), 0.49)) == pytest.approx(40.0, abs=1e-9)


def test_psnr_matches_numpy_formula():
    rng = np.random.default_rng(0)
    a, b = rng.random((10, 12, 3)), rng.random((10, 12, 3))
    assert psnr(torch.from_numpy(a).float(), b) == pytest.approx(
        10 * np.log10(1 / np.mean((a.astype(np.float32) - b) ** 2)), abs=1e-6
    )


def test_psnr_identical_is_inf():
    x = torch.rand(5, 5, 3)
    assert psnr(x, x) == math.inf


def test_masked_psnr_ignores_pixels_outside_mask():
    gt = torch.zeros(6, 8, 3)
    img = gt.clone()
    mask = torch.zeros(6, 8, dtype=torch.bool)
    mask[:, :4] = True
    img[:, :4] += 0.1  # error 0.1 inside the mask
    img[:, 4:] += 0.7  # a large error outside it
    assert psnr(img, gt, mask) == pytest.approx(20.0, abs=1e-5)
    assert psnr(img, gt, mask[..., None].float()) == pytest.approx(20.0, abs=1e-5)
    assert psnr(img, gt) < 10.0


def test_masked_psnr_with_soft_weights_is_weighted_mse():
    rng = np.random.default_rng(1)
    a, b, w = rng.random((5, 6, 3)), rng.random((5, 6, 3)), rng.random((5, 6))
    mse = np.sum(w[..., None] * (a - b) ** 2) / (3 * w.sum())
    assert psnr(a, b, w) == pytest.approx(-10 * np.log10(mse), abs=1e-9)


def test_psnr_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        psnr(torch.zeros(4, 4, 3), torch.zeros(4, 5, 3))
    with pytest.raises(ValueError, match="no pixels"):
        psnr(torch.zeros(4, 4, 3), torch.ones(4, 4, 3), torch.zeros(4, 4, dtype=torch.bool))


# --- SSIM -------------------------------------------------------------------------


def numpy_ssim_map(x, y):
    """INRIA's formula, written directly: 2D 11x11 window, zero padding 5, per channel."""
    coords = np.arange(11) - 5
    g = np.exp(-(coords**2) / (2 * 1.5**2))
    g /= g.sum()
    window = np.outer(g, g)

    def blur(img):  # img [H, W, C], 'same' size, zero padded
        h, w = img.shape[:2]
        padded = np.zeros((h + 10, w + 10, img.shape[2]))
        padded[5:-5, 5:-5] = img
        out = np.zeros_like(img, dtype=np.float64)
        for dy in range(11):
            for dx in range(11):
                out += window[dy, dx] * padded[dy : dy + h, dx : dx + w]
        return out

    mx, my = blur(x), blur(y)
    vx = blur(x * x) - mx**2
    vy = blur(y * y) - my**2
    cxy = blur(x * y) - mx * my
    c1, c2 = 0.01**2, 0.03**2
    return ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))


def test_ssim_of_identical_images_is_one():
    x = torch.rand(16, 20, 3, generator=torch.Generator().manual_seed(0))
    assert float(ssim(x, x)) == pytest.approx(1.0, abs=1e-6)


def test_ssim_matches_direct_numpy_formula():
    rng = np.random.default_rng(2)
    a = rng.random((19, 23, 3))
    b = np.clip(a + rng.normal(0, 0.2, a.shape), 0, 1)
    expected_map = numpy_ssim_map(a, b)
    got_map = ssim_map(torch.from_numpy(a), torch.from_numpy(b))
    np.testing.assert_allclose(got_map.numpy(), expected_map, atol=1e-10)
    got32 = float(ssim(torch.from_numpy(a).float(), torch.from_numpy(b).float()))
    assert got32 == pytest.approx(expected_map.mean(), abs=1e-5)
    assert expected_map.mean() < 0.9  # the images really differ


def test_ssim_batch_is_mean_of_images():
    x = torch.rand(3, 12, 14, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    y = torch.rand(3, 12, 14, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    per_image = torch.stack([ssim(x[i], y[i]) for i in range(3)])
    assert float(ssim(x, y)) == pytest.approx(float(per_image.mean()), abs=1e-12)
    assert ssim_map(x, y).shape == x.shape


def test_ssim_gradcheck():
    gen = torch.Generator().manual_seed(5)
    img = torch.rand(6, 7, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    gt = torch.rand(6, 7, 2, generator=gen, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda x: ssim(x, gt), (img,))


def test_ssim_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="ssim"):
        ssim(torch.zeros(5, 5, 3), torch.zeros(5, 6, 3))


# --- LPIPS --------------------------------------------------------------------------


def test_lpips_is_skipped_here_with_a_reason():
    reason = lpips_unavailable_reason()
    assert isinstance(reason, str) and reason
    assert lpips_or_none("cpu") is None
    with pytest.raises(TurboGSError, match="LPIPS unavailable"):
        LPIPS("cpu")


FAKE_LPIPS = textwrap.dedent(
    """
    import torch

    CALLS = []

    class _Model(torch.nn.Module):
        def forward(self, x, y, normalize=False):
            CALLS.append((tuple(x.shape), normalize))
            return (x - y).abs().mean(dim=(1, 2, 3), keepdim=True)

    def LPIPS(net="alex", verbose=True, **kwargs):
        CALLS.append(net)
        if kwargs.get("try_download"):
            torch.hub.download_url_to_file("https://example.invalid/vgg.pth", "/tmp/never")
        return _Model()
    """
)


@pytest.fixture
def fake_lpips(tmp_path, monkeypatch):
    """A stand-in `lpips` package and an empty torch hub folder, to walk the checks."""
    package = tmp_path / "site" / "lpips"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_LPIPS)
    monkeypatch.delitem(sys.modules, "lpips", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    hub = tmp_path / "hub"
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(hub))
    yield package, hub
    sys.modules.pop("lpips", None)


def test_lpips_reason_walks_through_each_missing_piece(fake_lpips):
    package, hub = fake_lpips
    assert "v0.1" in lpips_unavailable_reason() and "vgg.pth" in lpips_unavailable_reason()
    (package / "weights" / "v0.1").mkdir(parents=True)
    (package / "weights" / "v0.1" / "vgg.pth").write_bytes(b"")
    assert "vgg16-397923af.pth" in lpips_unavailable_reason()
    (hub / "checkpoints").mkdir(parents=True)
    (hub / "checkpoints" / "vgg16-397923af.pth").write_bytes(b"")
    assert lpips_unavailable_reason() is None

    scorer = lpips_or_none("cpu")
    assert scorer is not None
    import lpips

    assert lpips.CALLS[0] == "vgg"
    img, gt = torch.full((4, 5, 3), 0.75), torch.full((4, 5, 3), 0.25)
    assert scorer(img, gt) == pytest.approx(0.5)
    assert lpips.CALLS[-1] == ((1, 3, 4, 5), True)  # NCHW, [0, 1] inputs normalized by lpips


def test_lpips_import_failure_is_a_reason(fake_lpips):
    package, _ = fake_lpips
    (package / "__init__.py").write_text("raise ImportError(\"No module named 'torchvision'\")\n")
    assert "torchvision" in lpips_unavailable_reason()
    assert lpips_or_none("cpu") is None


def test_lpips_never_downloads(fake_lpips, monkeypatch):
    package, hub = fake_lpips
    (package / "weights" / "v0.1").mkdir(parents=True)
    (package / "weights" / "v0.1" / "vgg.pth").write_bytes(b"")
    (hub / "checkpoints").mkdir(parents=True)
    (hub / "checkpoints" / "vgg16-397923af.pth").write_bytes(b"")
    import lpips

    original = lpips.LPIPS
    monkeypatch.setattr(lpips, "LPIPS", lambda **kw: original(try_download=True, **kw))
    download = torch.hub.download_url_to_file
    with pytest.raises(TurboGSError, match="download"):
        LPIPS("cpu")
    assert torch.hub.download_url_to_file is download  # the guard is undone afterwards


def test_sampled_psnr_matches_a_boolean_gather():
    """The bar's PSNR over the sampled tiles (and the mask) equals the PSNR of the pixels a
    boolean index picks; whatever the renderer left outside them (NaN here) is never read; the
    whole image's equals metrics.psnr; nothing valid gives NaN."""
    from turbogs.metrics import sampled_psnr_tensor
    from turbogs.tiles import sampled_pixels

    g = torch.Generator().manual_seed(7)
    image, gt = torch.rand(40, 50, 3, generator=g), torch.rand(40, 50, 3, generator=g)
    assert float(sampled_psnr_tensor(image, gt, None)) == pytest.approx(psnr(image, gt), abs=1e-4)
    tile_mask = torch.tensor([[True, False, False, True], [False, True, False, False], [False, False, False, True]])
    mask = (torch.rand(40, 50, generator=g) > 0.3).float()
    inside = sampled_pixels(tile_mask, 50, 40)
    garbage = torch.where(inside[..., None], image, float("nan"))
    for m in (None, mask):
        keep = inside if m is None else inside & (m > 0.5)
        expected = -10 * math.log10(float(((image[keep] - gt[keep]) ** 2).mean()))
        assert float(sampled_psnr_tensor(garbage, gt, tile_mask, m)) == pytest.approx(expected, abs=1e-4)
    assert math.isnan(float(sampled_psnr_tensor(image, gt, tile_mask, torch.zeros(40, 50))))
    # From the listed tiles alone (partial tiles at the right and bottom edges): the same figure.
    ids = torch.nonzero(tile_mask.reshape(-1)).squeeze(1)
    for m in (None, mask):
        torch.testing.assert_close(sampled_psnr_tensor(garbage, gt, tile_mask, m, ids),
                                   sampled_psnr_tensor(garbage, gt, tile_mask, m), rtol=1e-5, atol=1e-5)
    assert math.isnan(float(sampled_psnr_tensor(image, gt, tile_mask, torch.zeros(40, 50), ids)))
