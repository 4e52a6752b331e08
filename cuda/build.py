"""Build `turbogs._C` from the kernels in this folder.

- `extension()`: the CUDAExtension that setup.py compiles when CUDA and a CUDA build of
  torch are present.
- `load_jit()`: compile (once, cached on disk) and import the same module at first use,
  for checkouts and installs without it. turbogs/kernels/turbo_cuda.py calls it.
- `load_cpu_jit()`: the CPU kernels of cpu/ (C++ on ATen, no CUDA), a module of their own
  (`turbogs_cpu`) so that a machine without nvcc gets them; turbogs/kernels/raster_cpu.py
  calls it.

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
# OpenMP as torch's own CPU build uses it: at::parallel_for is a `#pragma omp parallel` in
# ATen's headers, so without -fopenmp it would run every tile on one thread. The module
# links libgomp.so.1, which resolves to the copy torch has already loaded (one thread pool).
CPU_DIR = HERE / "cpu"
# -ffp-contract=off: no fused multiply-adds, so that the AVX-512, AVX2 and baseline copies of the kernels
# (cpu/rasterize_cpu.cpp) round every step alike, as torch's kernels do; -Wno-psabi: the
# vector types' ABI note for the baseline copy, whose vector functions are all inlined.
CPU_CXX_FLAGS = ["-O3", "-fopenmp", "-ffp-contract=off", "-Wno-psabi"]
CPU_LD_FLAGS = ["-fopenmp"]
CPU_MODULE = "turbogs_cpu"


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


def cpu_sources(source_dir: Path = CPU_DIR) -> List[Path]:
    return sorted(source_dir.glob("*.cpp"))


def cpu_headers() -> List[Path]:
    return sorted(CPU_DIR.glob("*.h"))


def cpu_build_dir() -> Path:
    """Beside the CUDA build, in a folder of its own (each torch build folder holds one module)."""
    return default_build_dir() / "cpu"


def cpu_build_is_current() -> bool:
    """Whether a built CPU module is there, newer than every source (then loading it compiles
    nothing; torch's loader decides for itself, this only tells whether to say so)."""
    built = list(cpu_build_dir().glob(CPU_MODULE + "*.so"))
    newest_source = max(path.stat().st_mtime for path in cpu_sources() + cpu_headers() + [Path(__file__)])
    return any(path.stat().st_mtime >= newest_source for path in built)


def load_cpu_jit(verbose: bool = False, source_dir: Optional[Path] = None, name: str = CPU_MODULE,
                 build_dir: Optional[Path] = None):
    """Compile the CPU kernels just in time (tens of seconds the first time, cached after)
    and return the module. Raises whatever torch's builder raises without a C++ compiler.
    `source_dir`, `name`, `build_dir`: another copy of cuda/cpu/ built as a module of its own
    (benchmarks/cpu_kernels_ab.py compares two revisions' kernels in one process)."""
    from torch.utils.cpp_extension import load

    source_dir = source_dir or CPU_DIR
    build_dir = build_dir or cpu_build_dir()
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=name,
        sources=[str(path) for path in cpu_sources(source_dir)],
        extra_include_paths=[str(source_dir)],
        extra_cflags=CPU_CXX_FLAGS,
        extra_ldflags=CPU_LD_FLAGS,
        build_directory=str(build_dir),
        verbose=verbose,
    )
