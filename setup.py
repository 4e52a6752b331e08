"""The parts of the build that pyproject.toml cannot declare.

- **Packages.** They are discovered (every package under turbogs/), plus the two folders that
  sit at the top of the repository and install inside the package: viewer/ as turbogs.viewer and
  cuda/ as turbogs.cuda. pyproject's `find` cannot map a folder to another package name.
- **The CUDA extension.** `turbogs._C` (our kernels in cuda/) is built only where both a CUDA
  toolchain and a CUDA build of torch are present; everywhere else the torch twins in
  turbogs/kernels/ are used. Set TURBOGS_NO_CUDA=1 to skip the build even on a CUDA machine: the
  sources ship as package data (turbogs/cuda/), so an installed TurboGS compiles them just in
  time on first use.
"""

import os
import sys

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))
INSTALLED_INSIDE = {"turbogs.viewer": "viewer", "turbogs.cuda": "cuda"}


def cuda_extensions():
    """([extension], cmdclass) when a CUDA build is possible, else ([], {})."""
    if os.environ.get("TURBOGS_NO_CUDA"):
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension
    except ImportError:
        return [], {}
    if torch.version.cuda is None or CUDA_HOME is None:
        return [], {}
    sys.path.insert(0, os.path.join(HERE, "cuda"))
    from build import extension  # cuda/build.py

    return [extension()], {"build_ext": BuildExtension}


ext_modules, cmdclass = cuda_extensions()

setup(
    packages=find_packages(include=["turbogs", "turbogs.*"]) + sorted(INSTALLED_INSIDE),
    package_dir=INSTALLED_INSIDE,
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
