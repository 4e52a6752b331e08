"""Build `turbogs._C` from the kernels in this folder.

- `extension()`: the CUDAExtension that setup.py compiles when CUDA and a CUDA build of
  torch are present.
- `load_jit()`: compile (once, cached on disk) and import the same module at first use,
  for checkouts and installs without it. turbogs/kernels/turbo_cuda.py calls it.

Only bindings.cpp includes torch; the .cu files need nvcc alone (cuda/compile_check.sh).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import List, Optional

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent

# No --use_fast_math: the kernels must agree with the torch twins to rounding level.
CXX_FLAGS = ["-O3"]
NVCC_FLAGS = ["-O3", "-lineinfo"]


def sources() -> List[Path]:
    """Every kernel file plus the one binding file."""
    return sorted(HERE.glob("*.cu")) + [HERE / "bindings.cpp"]


def nvcc_cuda_root(nvcc: Optional[str] = None) -> Optional[Path]:
    """The CUDA toolkit folder of `nvcc` (default: the one on PATH), as nvcc itself resolves
    it (it may be a wrapper script): the TOP of its dry run. None when there is no nvcc."""
    nvcc = nvcc or shutil.which("nvcc")
    if nvcc is None:
        return None
    dry_run = subprocess.run(
        [nvcc, "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull], capture_output=True, text=True
    )
    match = re.search(r"^#\$ TOP=(.+)$", dry_run.stdout + dry_run.stderr, re.MULTILINE)
    return Path(match.group(1)).resolve() if match else None


def extension():
    """The setuptools extension `turbogs._C` (paths relative to the repository root, as
    setuptools expects; run setup.py from there)."""
    from torch.utils.cpp_extension import CUDAExtension

    return CUDAExtension(
        name="turbogs._C",
        sources=[os.path.relpath(path, REPO_ROOT) for path in sources()],
        include_dirs=[str(HERE)],
        extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
    )


def default_build_dir() -> Path:
    """$TURBOGS_BUILD_DIR, else ~/.cache/turbogs/build."""
    configured = os.environ.get("TURBOGS_BUILD_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "turbogs" / "build"


def load_jit(verbose: bool = False):
    """Compile the extension just in time (minutes the first time, cached after) and
    return the module. Raises whatever torch's builder raises when no toolchain is there."""
    from torch.utils.cpp_extension import load

    build_dir = default_build_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name="turbogs_C",
        sources=[str(path) for path in sources()],
        extra_include_paths=[str(HERE)],
        extra_cflags=CXX_FLAGS,
        extra_cuda_cflags=NVCC_FLAGS,
        build_directory=str(build_dir),
        verbose=verbose,
    )
