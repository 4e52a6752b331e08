"""What the density-control tests share: a strategy's after_backward hook called with a step's figures."""

from types import SimpleNamespace

from turbogs.density.base import DensityStep

MOMENTS = ("exp_avg", "exp_avg_sq")  # the Adam moments every row edit must carry along


def after_backward(strategy, state, step, gaussians, optimizers, out, width, height, extent, blame=None, progress=0.0):
    """The strategy's after_backward hook for a step with these figures (`blame`: the probe's
    gradient; None when no probe was rendered)."""
    probe = None if blame is None else SimpleNamespace(grad=blame)
    return strategy.after_backward(state, DensityStep(step, progress, gaussians, optimizers, out, width, height,
                                                      extent, probe))
