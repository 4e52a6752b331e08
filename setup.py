"""TurboGS install script.

The package is pure Python. `turbogs._C` (our CUDA kernels in cuda/) is built only
where both a CUDA toolchain and a CUDA build of torch are present; everywhere else
the torch twins in turbogs/kernels/ are used. Set TURBOGS_NO_CUDA=1 to skip the build
even on a CUDA machine: the sources ship as package data (turbogs/cuda/), so an installed
TurboGS compiles them just-in-time on first use.
"""

import os
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))


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
    name="turbogs",
    version="0.1.0",
    description="3D Gaussian Splatting in about 100 seconds: error-guided sparse training",
    python_requires=">=3.10",
    packages=["turbogs", "turbogs.bench", "turbogs.data", "turbogs.density", "turbogs.kernels", "turbogs.render",
              "turbogs.turbo", "turbogs.viewer", "turbogs.cuda"],
    # viewer/ and cuda/ sit at the top of the repository and install inside the package.
    package_dir={"turbogs.viewer": "viewer", "turbogs.cuda": "cuda"},
    package_data={"turbogs.viewer": ["*.html", "*.js", "*.css"],
                  "turbogs.cuda": ["*.py", "*.cu", "*.h", "*.cpp", "*.sh"]},
    install_requires=[
        "torch>=2.4",  # install torch first (see README) so pip never pulls a CUDA build by accident
        "gsplat==1.5.3",
        "packaging",  # gsplat imports it without declaring it
        "numpy",
        "opencv-python-headless",
        "plyfile",
        "tqdm",
        "viser==1.1.1",
    ],
    # setuptools: tests/test_packaging.py builds the wheel without build isolation.
    extras_require={"test": ["pytest", "hypothesis", "playwright", "setuptools>=70.1"]},
    entry_points={"console_scripts": ["turbogs=turbogs.cli:main"]},
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
