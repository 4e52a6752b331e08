"""The TurboGS components: error-guided tile sampling (sampling.py), the tile-wise
structure-aware loss (losses.py), error-driven density control and the hybrid optimizer.

The error memory, sampler and loss run as CUDA kernels (turbogs._C, sources in cuda/)
on a GPU and as their torch twins (turbogs/kernels/turbo_torch.py) elsewhere; turbogs.kernels chooses.
"""

from turbogs.turbo.losses import LossConfig, TileLoss
from turbogs.turbo.sampling import ErrorMemory, SamplerConfig, TileSample, TileSampler

__all__ = ["ErrorMemory", "LossConfig", "SamplerConfig", "TileLoss", "TileSample", "TileSampler"]
