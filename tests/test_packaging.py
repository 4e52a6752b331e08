"""An installed TurboGS (the wheel, not the editable checkout) carries what it needs at run time:
every package, the viewer's files and the CUDA sources its just-in-time build compiles (cuda/
ships inside the package as turbogs/cuda), and it trains, exports, evaluates, renders and serves
from outside the source tree."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel `pip install .` builds, installed (not editable) into a folder of its own: a
    TurboGS outside the source tree. Its dependencies are this environment's."""
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
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", str(site),
                    str(wheel)], check=True, env=env, cwd=root)
    return site


def test_the_wheel_ships_every_package_of_the_tree(installed):
    in_tree = {p.parent.relative_to(REPO / "turbogs") for p in (REPO / "turbogs").rglob("__init__.py")}
    shipped = {p.parent.relative_to(installed / "turbogs") for p in (installed / "turbogs").rglob("__init__.py")}
    assert in_tree and in_tree | {Path("viewer")} <= shipped, sorted(map(str, in_tree - shipped))


@pytest.mark.slow
def test_the_installed_package_trains_exports_evaluates_renders_and_views(installed, tmp_path):
    """The commands a user runs, from a folder outside the checkout, on a copy of the demo capture."""
    scene, model = tmp_path / "demo", tmp_path / "model"
    shutil.copytree(REPO / "scenes" / "demo", scene, ignore=shutil.ignore_patterns(".turbogs_cache"))
    env = {**os.environ, "PYTHONPATH": str(installed)}

    def turbogs(*args):
        done = subprocess.run([sys.executable, "-m", "turbogs", *map(str, args)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"turbogs {' '.join(map(str, args))}: {done.stderr[-2000:]}"
        return done.stdout

    probe = subprocess.run([sys.executable, "-c", "import turbogs, turbogs.viewer; print(turbogs.__file__)"],
                           env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert probe.startswith(str(installed)), "the source tree was imported, not the installed copy"
    turbogs("train", scene, "--preset", "3dgs", "--steps", "30", "--eval", "--out", model, "--quiet")
    for fmt in ("ply", "splat", "spz", "sog"):
        turbogs("export", model, "-o", tmp_path / f"model.{fmt}")
        assert (tmp_path / f"model.{fmt}").stat().st_size > 0
    assert "PSNR" in turbogs("eval", model, "--no-images")
    turbogs("render", model, "--split", "test")
    assert len(list((model / "test").glob("ours_*/renders/*.png"))) == 4
    turbogs("render", model, "--path", "orbit", "--frames", "3", "--video", tmp_path / "orbit.mp4")
    assert (tmp_path / "orbit.mp4").stat().st_size > 0
    assert "usage: turbogs view" in turbogs("view", "--help")
    script = installed / "bin" / "turbogs"  # the console script pip installed
    assert subprocess.run([str(script), "--help"], env=env, capture_output=True, text=True).returncode == 0


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
