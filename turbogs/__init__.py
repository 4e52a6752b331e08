"""TurboGS: 3D Gaussian Splatting trained in about 100 seconds on one GPU."""

__version__ = "0.1.0"
