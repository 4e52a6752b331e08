"""The kernels in cuda/ compile with nvcc alone, and the torch glue compiles against torch.

Runs wherever nvcc is on PATH (CI included); no GPU is needed."""

import importlib.util
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

CUDA_DIR = Path(__file__).resolve().parents[1] / "cuda"
NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH")


def load_build_script():
    spec = importlib.util.spec_from_file_location("turbogs_cuda_build", CUDA_DIR / "build.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_kernel_compiles_for_sm90():
    result = subprocess.run(["bash", str(CUDA_DIR / "compile_check.sh")], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    for source in sorted(CUDA_DIR.glob("*.cu")):
        assert f"ok      {source.name}" in result.stdout


def test_compile_check_fails_on_a_broken_kernel(tmp_path):
    shutil.copy(CUDA_DIR / "compile_check.sh", tmp_path)
    for header in CUDA_DIR.glob("*.h"):
        shutil.copy(header, tmp_path)
    (tmp_path / "broken.cu").write_text('#include "turbo_kernels.h"\n__global__ void k(float* x) { x[0] = y; }\n')
    result = subprocess.run(["bash", str(tmp_path / "compile_check.sh")], capture_output=True, text=True)
    assert result.returncode != 0
    assert "FAILED  broken.cu" in result.stderr


def test_kernel_sources_do_not_include_torch():
    for path in list(CUDA_DIR.glob("*.cu")) + list(CUDA_DIR.glob("*.h")):
        for line in path.read_text().splitlines():
            if line.strip().startswith("#include"):
                assert not any(name in line for name in ("torch", "ATen", "c10", "pybind")), f"{path.name}: {line}"


def test_build_lists_every_kernel_and_the_bindings():
    build = load_build_script()
    assert set(build.sources()) == set(CUDA_DIR.glob("*.cu")) | {CUDA_DIR / "bindings.cpp"}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not on PATH")
def test_bindings_compile_against_torch_headers(tmp_path):
    """Syntax-checks cuda/bindings.cpp with g++ against the installed torch headers. A CPU
    build of torch lacks one generated CUDA header; a stand-in with its one define is used."""
    from torch.utils.cpp_extension import include_paths

    cuda_root = load_build_script().nvcc_cuda_root(NVCC)
    assert cuda_root is not None and (cuda_root / "include" / "cuda_runtime.h").is_file()
    torch_includes = include_paths()
    generated = Path("c10/cuda/impl/cuda_cmake_macros.h")
    if not any((Path(p) / generated).is_file() for p in torch_includes):
        (tmp_path / generated).parent.mkdir(parents=True)
        (tmp_path / generated).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    command = ["g++", "-std=c++20", "-fsyntax-only", "-Wall", "-DTORCH_EXTENSION_NAME=_C"]
    command += [f"-I{p}" for p in torch_includes]
    command += [f"-I{sysconfig.get_paths()['include']}", f"-I{cuda_root / 'include'}", f"-I{tmp_path}", f"-I{CUDA_DIR}"]
    command.append(str(CUDA_DIR / "bindings.cpp"))
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-4000:]


def test_every_kernel_launch_is_checked():
    """Each launcher call in the bindings is followed by C10_CUDA_KERNEL_LAUNCH_CHECK, so a bad
    launch raises at once, naming the op, instead of turning up at a later, unrelated sync."""
    import re

    source = (CUDA_DIR / "bindings.cpp").read_text()
    launches = list(re.finditer(r"turbogs::(launch_\w+)\(.*?\);", source, re.DOTALL))
    declared = set(re.findall(r"void (launch_\w+)\(", (CUDA_DIR / "turbo_kernels.h").read_text()))
    assert {m.group(1) for m in launches} == declared
    for launch in launches:
        following = source[launch.end():].lstrip()
        assert following.startswith("C10_CUDA_KERNEL_LAUNCH_CHECK();"), f"{launch.group(1)} is not checked"
