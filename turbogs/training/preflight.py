"""Will this run fit? A memory estimate made before training starts.

Running out of memory an hour into a run wastes the hour; most of what a run needs is
known up front: the images (every view, float32 RGB, kept on the data device) and the
Gaussians (their parameters, gradients and two Adam moments, up to the count the density
control may grow to) plus the render buffers of the largest view. When that does not fit
in what the device has free, `check_memory` refuses with one line naming the estimate and
the flags that shrink it.

The estimate is deliberately a floor (uncapped INRIA growth counts only the initial
Gaussians): a run it refuses would certainly fail, a run it passes may still run out, and
then the training loop's out-of-memory handler saves a checkpoint and gives advice.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import torch

from turbogs.data.scene import Scene
from turbogs.errors import TurboGSError
from turbogs.training.config import TrainConfig
from turbogs.training.init_points import background_count
from turbogs.training.init_size import INRIA_RANDOM_POINTS

FLOAT_BYTES = 4
# Per Gaussian, besides its parameters: the projected 2D quantities a render produces
# (mean 2, conic 3, color 3, opacity 1, depth 1, radius 2 = 12 floats) and their gradients.
RENDER_FLOATS_PER_GAUSSIAN = 24
# Per pixel of the largest view: the rendered image, alpha, the loss's intermediates
# (L1, SSIM's five blurred maps) and their gradients, rounded up.
RENDER_FLOATS_PER_PIXEL = 64
GIB = 2**30


def params_per_gaussian(sh_degree: int) -> int:
    """Floats of one Gaussian: mean 3, scale 3, quaternion 4, opacity 1, SH 3*(d+1)^2 (59 at degree 3)."""
    return 3 + 3 + 4 + 1 + 3 * (sh_degree + 1) ** 2


def gaussian_budget(scene: Scene, cfg: TrainConfig) -> int:
    """How many Gaussians the run may hold: the density control's cap where there is one, else
    the initial count (a floor: INRIA's rule has no cap)."""
    if scene.points is not None and len(scene.points):
        initial = len(scene.points) + background_count(len(scene.points), cfg.background_points)
    else:
        initial = cfg.init_random_points or INRIA_RANDOM_POINTS
    cap = cfg.density.max_gaussians
    return initial if cap is None else max(initial, cap)


@dataclass
class MemoryEstimate:
    """Bytes a run needs, split by what needs them and by device type ("cpu", "cuda")."""

    images: int
    gaussians: int
    render: int
    num_gaussians: int
    image_device: str
    compute_device: str

    def per_device(self) -> Dict[str, int]:
        need = {self.compute_device: self.gaussians + self.render}
        need[self.image_device] = need.get(self.image_device, 0) + self.images
        return need


def estimate_memory(scene: Scene, cfg: TrainConfig, device: torch.device,
                    data_device: Optional[torch.device] = None) -> MemoryEstimate:
    views = list(scene.train) + list(scene.test)

    def pixels(cameras, alphas: bool = False) -> int:
        """Floats of RGB, masks and (to composite onto random colours) the photos' alphas."""
        return sum(c.height * c.width * (3 + (c.mask is not None) + (alphas and c.alpha is not None)) for c in cameras)

    train = pixels(scene.train, cfg.random_background)
    images = (train + pixels(scene.test)) * FLOAT_BYTES
    if cfg.coarse_to_fine.enabled:  # beside them, the training views at a smaller size: at most half, a quarter
        images += train * FLOAT_BYTES // 4
    count = gaussian_budget(scene, cfg)
    # parameters + gradients + Adam's two moments = 4 copies of the parameters
    gaussians = count * params_per_gaussian(cfg.sh_degree) * FLOAT_BYTES * 4
    largest = max((c.height * c.width for c in views), default=0)
    render = (count * RENDER_FLOATS_PER_GAUSSIAN + largest * RENDER_FLOATS_PER_PIXEL) * FLOAT_BYTES
    data_device = device if data_device is None else data_device
    return MemoryEstimate(images, gaussians, render, count, data_device.type, device.type)


def cpu_available_bytes(meminfo: Path = Path("/proc/meminfo")) -> Optional[int]:
    """MemAvailable from /proc/meminfo (what can be allocated without swapping), or None off Linux."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes(device_type: str, device: torch.device) -> Optional[int]:
    if device_type == "cuda":
        free, _total = torch.cuda.mem_get_info(device if device.type == "cuda" else None)
        return int(free)
    return cpu_available_bytes()


def check_memory(scene: Scene, cfg: TrainConfig, device: torch.device, data_device: Optional[torch.device] = None,
                 max_memory_bytes: Optional[int] = None) -> MemoryEstimate:
    """Refuse, with one line, a run whose estimate exceeds what a device has free.

    `max_memory_bytes` (--max-memory) caps what each device is taken to have, to rehearse a
    smaller machine. On the CPU the scene's images are already loaded, so they count as
    available too (they are part of both the need and the memory in use)."""
    estimate = estimate_memory(scene, cfg, device, data_device)
    for device_type, need in estimate.per_device().items():
        have = available_bytes(device_type, device)
        if have is not None and device_type == "cpu":
            have += estimate.images if estimate.image_device == "cpu" else 0
        if max_memory_bytes is not None:
            have = max_memory_bytes if have is None else min(have, max_memory_bytes)
        if have is not None and need > have:
            raise TurboGSError(memory_message(estimate, device_type, need, have))
    return estimate


def memory_message(estimate: MemoryEstimate, device_type: str, need: int, have: int) -> str:
    parts = []
    if estimate.image_device == device_type:
        parts.append(f"images {estimate.images / GIB:.2f}")
    if estimate.compute_device == device_type:
        parts.append(f"{estimate.num_gaussians} Gaussians {estimate.gaussians / GIB:.2f}")
        parts.append(f"render buffers {estimate.render / GIB:.2f}")
    helps = ["-r 2/4/8 (smaller images)"]
    if device_type == "cuda" and estimate.image_device == "cuda":
        helps.append("--data-device cpu (images stay in CPU memory)")
    helps.append(f"--max-gaussians N (fewer than {estimate.num_gaussians})")
    return (f"not enough {device_type} memory: this run needs about {need / GIB:.2f} GiB ({', '.join(parts)} GiB) "
            f"but {have / GIB:.2f} GiB is available; try " + ", ".join(helps))


def disk_bytes_needed(estimate: MemoryEstimate, sh_degree: int, keep_checkpoints: int) -> int:
    """Disk for the outputs: `keep_checkpoints` + 1 checkpoints in flight (parameters and two Adam
    moments each) and the final PLY."""
    params = estimate.num_gaussians * params_per_gaussian(sh_degree) * FLOAT_BYTES
    return (keep_checkpoints + 1) * 3 * params + params
