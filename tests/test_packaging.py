"""An installed TurboGS carries what it needs at run time: the viewer's files and the CUDA
sources its just-in-time build compiles (cuda/ ships inside the package as turbogs/cuda)."""

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel `pip install .` would install, unpacked: a TurboGS outside the source tree."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"  # a copy, so that the build leaves no build/ folder in the checkout
    skip = shutil.ignore_patterns("__pycache__", "*.so", "build", "*.egg-info")
    for folder in ("turbogs", "viewer", "cuda"):
        shutil.copytree(REPO / folder, source / folder, ignore=skip)
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    env = {**os.environ, "TURBOGS_NO_CUDA": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(root / "dist")], check=True, env=env, cwd=root)
    (wheel,) = (root / "dist").glob("turbogs-*.whl")
    site = root / "site"
    zipfile.ZipFile(wheel).extractall(site)
    return site


def test_the_wheel_ships_every_kernel_source_and_the_viewer(installed):
    shipped = {p.name for p in (installed / "turbogs" / "cuda").iterdir()}
    in_repo = {p.name for p in (REPO / "cuda").iterdir() if p.suffix in (".py", ".cu", ".h", ".cpp", ".sh")}
    assert in_repo and in_repo <= shipped
    assert (installed / "turbogs" / "viewer" / "__init__.py").is_file()


def test_the_jit_build_finds_its_sources_in_an_installed_package(installed):
    """turbo_cuda.build_script() of the installed copy is the installed build.py, and every
    source it would compile is there (the compile itself needs a GPU machine)."""
    probe = (
        "import importlib.util, turbogs\n"
        "from turbogs.kernels import turbo_cuda\n"
        "script = turbo_cuda.build_script()\n"
        "spec = importlib.util.spec_from_file_location('build', script)\n"
        "build = importlib.util.module_from_spec(spec); spec.loader.exec_module(build)\n"
        "print(turbogs.__file__); print(script)\n"
        "print(all(p.is_file() for p in build.sources()) and len(build.sources()) > 1)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(installed)}
    out = subprocess.run([sys.executable, "-c", probe], check=True, env=env, cwd=installed.parent,
                         capture_output=True, text=True).stdout.split("\n")
    package_file, script, sources_present = out[:3]
    assert package_file.startswith(str(installed)), "the source tree was imported, not the installed copy"
    assert script == str(installed / "turbogs" / "cuda" / "build.py")
    assert sources_present == "True"


def test_the_source_checkout_finds_the_top_level_cuda_folder():
    from turbogs.kernels import turbo_cuda

    script = turbo_cuda.build_script()
    assert script.is_file()
    spec = importlib.util.spec_from_file_location("build", script)
    assert spec is not None
